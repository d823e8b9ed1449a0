use collective_factory::bootstrap::TcpBootstrap;
use collective_factory::{Collective, Config, half::bf16, nvidia};
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let comm = nvidia::from_bootstrap(Arc::new(TcpBootstrap::from_env()?), &Config::new())?;
    let stream = comm.context().new_stream()?;
    let x = stream.clone_htod(&vec![bf16::from_f32(1.5); 1 << 20])?;
    let mut y = stream.alloc_zeros::<bf16>(1 << 20)?;
    comm.all_reduce_into(&x, &mut y, &stream)?; // enqueued: the same bits on every rank and route
    comm.synchronize(&stream)?; // waits for the stream, then reports any failure of the calls
    let sum = stream.clone_dtoh(&y)?;
    println!("rank {}: {}", comm.rank(), sum[0]);
    Ok(())
}
