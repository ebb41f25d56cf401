//! In-memory throughput of the data path, for orientation (no sockets):
//! `cargo test --release -p iwarp --test throughput -- --ignored --nocapture`.
//!
//! Per payload byte the engine does one CRC pass on each side; the
//! harness adds the two copies a kernel socket pair would make (into the
//! "wire", and from it into place through `recv_target`/`placed`).

mod common;

use std::time::Instant;

use common::{datapaths, params, Chunking, Dir};
use iwarp::engine::{Payload, WriteWr};
use iwarp::mem::Access;

#[test]
#[ignore]
fn write_throughput() {
    for (crc, markers, budget) in [
        (true, false, 256 << 10),
        (true, false, 4 << 20),
        (false, false, 256 << 10),
        (true, true, 256 << 10),
    ] {
        let p = params(crc, markers, 65483);
        let mut pair = datapaths(p, p, 1);
        pair.direct = true;
        pair.chunking = Chunking { max: 1 << 20 };
        pair.budget = budget;
        let len = 64 << 20;
        let src = pair.a.mem.add(vec![7; len]);
        let dst = pair.b.mem.add(vec![0; len]);
        let stag = pair
            .b
            .ep
            .register(dst, 0, len as u64, Access::REMOTE_WRITE)
            .unwrap();
        let rounds = 16;
        let t = Instant::now();
        for i in 0..rounds {
            pair.a
                .ep
                .post_write(WriteWr {
                    wr_id: i,
                    remote_stag: stag,
                    remote_to: 0,
                    payload: Payload::region(src, 0, len),
                    signaled: false,
                })
                .unwrap();
            pair.drive();
        }
        let secs = t.elapsed().as_secs_f64();
        let gbps = (rounds as f64 * len as f64) / secs / 1e9;
        assert_eq!(pair.completions(Dir::AtoB), vec![]);
        let copy = {
            let a = vec![1u8; len];
            let mut b = vec![0u8; len];
            let t = Instant::now();
            for _ in 0..rounds {
                b.copy_from_slice(&a);
                std::hint::black_box(&mut b);
            }
            (rounds as f64 * len as f64) / t.elapsed().as_secs_f64() / 1e9
        };
        println!(
            "crc {crc} markers {markers} budget {budget}: {gbps:.2} GB/s through the \
             engine (one memcpy alone: {copy:.2} GB/s)"
        );
    }
}
