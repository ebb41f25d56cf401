//! The data path's receiver fed an arbitrary stream. The first byte picks
//! CRC (bit 0), markers (bit 1), the receive path (bit 2: direct placement
//! through `recv_target`/`placed`, else `handle_input`) and IRD 0 or 2
//! (bit 3); the second seeds the chunk sizes; the rest is the stream.
//!
//! Nothing may panic, and no byte outside what was registered for the peer
//! or posted as a receive buffer may change (RFC 5040 §8.1.1 item 3): the
//! guard bytes around every such range are checked at the end. Whatever
//! the engine sends back (Read Responses, a Terminate) is drained through
//! the gather list.
#![no_main]

use iwarp::engine::{DataPath, Params, ReadWr, RecvTarget, RecvWr, RtrRole, Sge};
use iwarp::mem::{Access, Memory, Pd, RegionId, VecMemory};
use libfuzzer_sys::fuzz_target;

const GUARD: u8 = 0xaa;

fuzz_target!(|data: &[u8]| {
    let [sel, seed, stream @ ..] = data else {
        return;
    };
    let direct = sel & 4 != 0;
    let mut dp = DataPath::new(Pd(1), 1);
    let mut mem = VecMemory::new();
    // Region 0: [1024, 2048) for remote write and read.
    let r0 = mem.add(vec![GUARD; 4096]);
    mem.region_mut(r0).unwrap()[1024..2048].fill(0);
    dp.register(r0, 1024, 1024, Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    // Region 1: two receive buffers.
    let r1 = mem.add(vec![GUARD; 4096]);
    mem.region_mut(r1).unwrap()[1024..3072].fill(0);
    for (i, offset) in [1024, 2048].into_iter().enumerate() {
        dp.post_recv(RecvWr {
            wr_id: i as u64,
            sge: Sge {
                region: r1,
                offset,
                len: 1024,
            },
        })
        .unwrap();
    }
    // Region 2: the sink of one RDMA Read of ours.
    let r2 = mem.add(vec![GUARD; 4096]);
    mem.region_mut(r2).unwrap()[1024..2048].fill(0);
    let sink = dp.register(r2, 1024, 1024, Access::LOCAL_WRITE).unwrap();
    dp.enable(Params {
        crc: sel & 1 != 0,
        tx_markers: sel & 2 != 0,
        rx_markers: sel & 2 != 0,
        ird: if sel & 8 != 0 { 2 } else { 0 },
        ord: 2,
        emss: 1460,
        rtr: RtrRole::None,
        gated: false,
    });
    dp.post_read(ReadWr {
        wr_id: 9,
        local_stag: sink,
        local_to: 0,
        remote_stag: iwarp::wire::ddp::Stag(0x100),
        remote_to: 0,
        len: 1024,
        signaled: true,
    })
    .unwrap();
    drain(&mut dp, &mem);

    let mut rng = u64::from(*seed) | 1;
    let mut rest = stream;
    while !rest.is_empty() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let n = (1 + (rng % 300) as usize).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let mut c = chunk;
        while !c.is_empty() {
            if !direct {
                let used = dp.handle_input(c, &mut mem);
                assert_eq!(used, c.len());
                break;
            }
            match dp.recv_target() {
                RecvTarget::Scratch { max } => {
                    let k = max.min(c.len());
                    assert!(k > 0);
                    assert_eq!(dp.handle_input(&c[..k], &mut mem), k);
                    c = &c[k..];
                }
                RecvTarget::Place {
                    region,
                    offset,
                    len,
                } => {
                    let k = len.min(c.len());
                    let dst = mem
                        .region_mut(region)
                        .and_then(|r| r.get_mut(offset..offset + k))
                        .expect("placement target inside memory");
                    dst.copy_from_slice(&c[..k]);
                    dp.placed(k, &mut mem);
                    c = &c[k..];
                }
            }
        }
        drain(&mut dp, &mem);
        while dp.poll_completion().is_some() {}
        while dp.poll_event().is_some() {}
    }

    for r in [RegionId(0), RegionId(1), RegionId(2)] {
        let bytes = mem.region(r).unwrap();
        let end = if r == r1 { 3072 } else { 2048 };
        assert!(bytes[..1024].iter().all(|&b| b == GUARD), "below {r:?}");
        assert!(bytes[end..].iter().all(|&b| b == GUARD), "above {r:?}");
    }
});

fn drain(dp: &mut DataPath, mem: &VecMemory) {
    for _ in 0..64 {
        let n = dp.poll_transmit(mem, 1 << 16);
        if n == 0 {
            return;
        }
        let mut total = 0;
        dp.txq()
            .for_each_slice(mem, |s| {
                total += s.len();
                true
            })
            .expect("queued memory present");
        assert_eq!(total, n);
        dp.tx_advance(n);
    }
}
