//! Which ordinary stream work between calls stalls ranks that are threads sharing one GPU
//! (issue 24's decomposition), with the engine's lockstep on (`DETCOLL_LOCKSTEP=1`, the
//! default) or off (`=0`, to see what it prevents).
//!
//! ```text
//! shared_gpu_decompose --world 8 --calls 300 --bytes 4096 --variant htod,dtoh,alloc,...
//! ```
//! Each rank (a thread, its own stream) makes `--calls` all_reduce calls of `--bytes`, doing
//! one kind of work before or after each call — `none`; `htod` (a pageable upload into a kept
//! buffer); `dtoh` (a pageable download of the result, which waits for the call); `sync` (a
//! stream synchronize after the call); `alloc` (a stream-ordered allocation before the call,
//! freed after it); `memset` (a memset of the kept output); `stream` (a new stream per call);
//! `readme` (the README's whole pattern: clone_htod, alloc_zeros, the call, clone_dtoh, frees)
//! — and reports per variant how many calls completed before the first error and which error.
//! Set `DETCOLL_TIMEOUT_MS` low (e.g. 1000) so a stall shows quickly.
#![cfg_attr(not(feature = "cuda"), allow(unused))]

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use collective_core::Collective;
    use collective_factory::{Config, nvidia};
    use std::time::Instant;

    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| -> String {
        args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned().unwrap_or_else(|| default.into())
    };
    let world: usize = arg("--world", "2").parse()?;
    let calls: usize = arg("--calls", "300").parse()?;
    let n: usize = arg("--bytes", "4096").parse::<usize>()? / 4;
    let variants = arg("--variant", "none,htod,dtoh,sync,alloc,memset,stream,readme");
    let lockstep = std::env::var("DETCOLL_LOCKSTEP").unwrap_or_else(|_| "1".into());
    for variant in variants.split(',') {
        let ranks = nvidia::thread_group(world, &Config::new().with_capacity(4 << 20))?;
        let t = Instant::now();
        let results: Vec<(usize, Option<String>)> = std::thread::scope(|s| {
            let hs: Vec<_> = ranks
                .iter()
                .map(|comm| {
                    s.spawn(move || {
                        let run = || -> Result<usize, (usize, String)> {
                            let e = |i: usize| move |err: &dyn std::fmt::Display| (i, err.to_string());
                            let ctx = comm.context();
                            let stream = ctx.new_stream().map_err(|x| e(0)(&x))?;
                            let host = vec![1.0f32 + comm.rank() as f32; n];
                            let mut back = vec![0f32; n];
                            let mut x = stream.clone_htod(&host).map_err(|x| e(0)(&x))?;
                            let mut y = stream.alloc_zeros::<f32>(n).map_err(|x| e(0)(&x))?;
                            stream.synchronize().map_err(|x| e(0)(&x))?;
                            for i in 0..calls {
                                let err = e(i);
                                match variant {
                                    "htod" => stream.memcpy_htod(&host, &mut x).map_err(|x| err(&x))?,
                                    "memset" => stream.memset_zeros(&mut y).map_err(|x| err(&x))?,
                                    _ => {}
                                }
                                let extra_stream = if variant == "stream" {
                                    Some(ctx.new_stream().map_err(|x| err(&x))?)
                                } else {
                                    None
                                };
                                if variant == "alloc" {
                                    // SAFETY: never read; freed (stream-ordered) after the call.
                                    let tmp = unsafe { stream.alloc::<f32>(n) }.map_err(|x| err(&x))?;
                                    comm.all_reduce_into(&x, &mut y, &stream).map_err(|x| err(&x))?;
                                    drop(tmp);
                                } else if variant == "readme" {
                                    let xi = stream.clone_htod(&host).map_err(|x| err(&x))?;
                                    let mut yi = stream.alloc_zeros::<f32>(n).map_err(|x| err(&x))?;
                                    comm.all_reduce_into(&xi, &mut yi, &stream).map_err(|x| err(&x))?;
                                    back = stream.clone_dtoh(&yi).map_err(|x| err(&x))?;
                                } else {
                                    comm.all_reduce_into(&x, &mut y, &stream).map_err(|x| err(&x))?;
                                }
                                match variant {
                                    "dtoh" => stream.memcpy_dtoh(&y, &mut back).map_err(|x| err(&x))?,
                                    "sync" => stream.synchronize().map_err(|x| err(&x))?,
                                    _ => {}
                                }
                                drop(extra_stream);
                            }
                            comm.synchronize(&stream).map_err(|x| e(calls)(&x))?;
                            Ok(calls)
                        };
                        match run() {
                            Ok(c) => (c, None),
                            Err((i, m)) => (i, Some(m)),
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
        });
        let done = results.iter().map(|r| r.0).min().unwrap_or(0);
        let first = results.iter().filter_map(|r| r.1.clone()).next();
        println!(
            "{{\"world\":{world},\"lockstep\":\"{lockstep}\",\"variant\":\"{variant}\",\"bytes\":{},\"calls\":{calls},\"completed\":{done},\"ms\":{},\"error\":{:?}}}",
            n * 4,
            t.elapsed().as_millis(),
            first.unwrap_or_default()
        );
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("shared_gpu_decompose needs the `cuda` feature");
}
