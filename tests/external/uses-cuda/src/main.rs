//! Without a GPU driver, building the NVIDIA collective must be a typed error, never a panic
//! (detcoll's default: libcuda loaded at run time). With a GPU it succeeds.
#![forbid(unsafe_code)]

fn main() {
    match uses_cuda::single_rank() {
        Ok(_) => println!("uses-cuda: NVIDIA collective built (a GPU is present)"),
        Err(e) => println!("uses-cuda: no NVIDIA GPU here, typed error: {e}"),
    }
}
