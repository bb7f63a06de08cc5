//! Measures launch throughput: `cargo run --release -p cpu-executor --example throughput`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use cpu_executor::{item, CpuExecutor, Dim3, Geometry, WaveSize};

fn main() {
    let threads = std::env::args().nth(1).map_or(0, |t| t.parse().unwrap());
    let block: u32 = std::env::args().nth(2).map_or(256, |b| b.parse().unwrap());
    let mut exec = CpuExecutor::new(WaveSize::W64);
    if threads > 0 {
        exec = exec.with_threads(threads);
    }
    let items = 1u32 << 20;

    let geometry = Geometry { grid: Dim3::x(items / block), block: Dim3::x(block) };
    let sum = AtomicU64::new(0);
    let trivial = || {
        black_box(item::thread_idx());
    };
    let with_barrier = || {
        let t = item::flat_thread_idx();
        item::barrier();
        black_box(t);
    };
    let with_wave_op = || {
        let lanes = item::wave_exchange(u64::from(item::lane_id()));
        if item::lane_id() == 0 {
            sum.fetch_add(lanes.values.iter().sum(), Ordering::Relaxed);
        }
    };
    let kernels: [(&str, &(dyn Fn() + Sync)); 3] =
        [("trivial", &trivial), ("one barrier", &with_barrier), ("one wave_exchange", &with_wave_op)];
    println!("{} threads, 2^20 work-items in blocks of {block}", exec.threads());
    for (name, kernel) in kernels {
        exec.run(geometry, 0, kernel).unwrap(); // warm the stack cache
        let start = Instant::now();
        let stats = exec.run(geometry, 0, kernel).unwrap();
        let elapsed = start.elapsed();
        assert_eq!(stats.work_items, u64::from(items));
        println!(
            "{name:>18}: {:>8.1} ms ({:.0} ns per work-item)",
            elapsed.as_secs_f64() * 1e3,
            elapsed.as_nanos() as f64 / f64::from(items)
        );
    }
}
