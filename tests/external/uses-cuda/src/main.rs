//! Without a GPU driver, building the NVIDIA collective must be a typed error, never a panic
//! (detcoll's default: libcuda loaded at run time). With a GPU it succeeds.
#![forbid(unsafe_code)]

fn main() {
    match uses_cuda::single_rank() {
        Ok(comm) => {
            let got = uses_cuda::all_reduce_cudarc(&comm, &[1.5; 1024]).expect("all_reduce of cudarc buffers");
            assert_eq!(got.to_bits(), 1.5f32.to_bits(), "world 1: the input itself");
            println!("uses-cuda: NVIDIA collective built and used with cudarc buffers (a GPU is present)");
        }
        Err(e) => println!("uses-cuda: no NVIDIA GPU here, typed error: {e}"),
    }
}
