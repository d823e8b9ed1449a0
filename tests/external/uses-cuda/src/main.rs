//! Without a GPU driver, building the NVIDIA collective must be a typed error, never a panic
//! (detcoll's default: libcuda loaded at run time). With a GPU it succeeds.
#![forbid(unsafe_code)]

fn main() {
    match uses_cuda::single_rank() {
        Ok(comm) => {
            let got = uses_cuda::all_reduce_cudarc(&comm, &[1.5; 1024]).expect("all_reduce of cudarc buffers");
            assert_eq!(got.to_bits(), 1.5f32.to_bits(), "world 1: the input itself");
            println!("uses-cuda: NVIDIA collective built and used with cudarc buffers (a GPU is present)");
            let (rows, hidden, eps) = (2, 1000, 1e-6);
            let v = |i: usize, k: usize| ((i * 31 + k) % 97) as f32 / 13.0 - 3.0;
            let (x, residual): (Vec<f32>, Vec<f32>) = (0..rows * hidden).map(|i| (v(i, 1), v(i, 2))).unzip();
            let weight: Vec<f32> = (0..hidden).map(|i| v(i, 3)).collect();
            let (h, y) = uses_cuda::fused_norm_cudarc(&comm, &x, &residual, &weight, eps).expect("fused call");
            use collective_factory::fixed_tree::{RmsNormShape, residual_rmsnorm};
            let (mut rh, mut ry) = (vec![0f32; rows * hidden], vec![0f32; rows * hidden]);
            residual_rmsnorm(&[&x[..]], &residual, &weight, eps, RmsNormShape { rows, hidden }, &mut rh, &mut ry)
                .expect("reference");
            let bits = |v: &[f32]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
            assert_eq!((bits(&h), bits(&y)), (bits(&rh), bits(&ry)), "fused call = fixed_tree");
            println!("uses-cuda: fused all_reduce + residual + RMSNorm of cudarc buffers = fixed_tree");
        }
        Err(e) => println!("uses-cuda: no NVIDIA GPU here, typed error: {e}"),
    }
}
