//! A stream's figures for observability, kept where a reader takes them
//! without the stream's lock (DESIGN §7: "Statistics are counters the data
//! path bumps in place; the state export reads them in the background").
//!
//! Whoever holds the lock copies the link's counters in when it lets go
//! ([`Counters::store`]: a few dozen plain stores); [`Counters::load`]
//! reads them as a sequence lock does — again if a store ran meanwhile —
//! so a reader never sees half of one call's figures and half of the next.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use crate::conn::{FlowControlMode, ZcopyStats};
use crate::link::direct::CopyStats;

/// The figures of [`Counters`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Flow Control Mode of our sending half-connection.
    pub send_mode: Option<FlowControlMode>,
    /// Flow Control Mode of our receiving half-connection.
    pub recv_mode: Option<FlowControlMode>,
    /// Bytes and messages by mechanism.
    pub zcopy: ZcopyStats,
    /// Bcopy bytes by the copies they took.
    pub copies: CopyStats,
    /// Our send credit (the peer's buffers we may fill).
    pub send_credit: i64,
    /// The peer's send credit as we last gave it.
    pub remote_credit: i64,
    /// The same-host path ([`crate::conn::local`]): [`crate::conn::local::code`].
    pub local: u64,
    /// Waits for the peer (a blocking read, a blocking connect's setup)
    /// that ended while polling the socket ([`super::busy_poll`]), and
    /// waits that slept.
    pub waits_polled: u64,
    pub waits_slept: u64,
}

const FIELDS: usize = 22;

/// How often [`Counters::load`] looks again at once while a store runs;
/// after that it gives the core away between looks (the storing thread
/// may have been preempted in the middle), up to [`PATIENCE`].
const SPINS: usize = 1_000;

/// How long [`Counters::load`] waits for a store to end.
const PATIENCE: std::time::Duration = std::time::Duration::from_millis(200);

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Counters {
    /// Odd while a store runs.
    seq: AtomicU64,
    fields: [AtomicU64; FIELDS],
}

fn mode_code(m: Option<FlowControlMode>) -> u64 {
    match m {
        None => 0,
        Some(FlowControlMode::Buffered) => 1,
        Some(FlowControlMode::Combined) => 2,
        Some(FlowControlMode::Pipelined) => 3,
    }
}

fn mode_of(v: u64) -> Option<FlowControlMode> {
    match v {
        1 => Some(FlowControlMode::Buffered),
        2 => Some(FlowControlMode::Combined),
        3 => Some(FlowControlMode::Pipelined),
        _ => None,
    }
}

impl Snapshot {
    fn to_fields(self) -> [u64; FIELDS] {
        let z = self.zcopy;
        let c = self.copies;
        [
            // The modes and the same-host code share a word.
            mode_code(self.send_mode) | mode_code(self.recv_mode) << 8 | self.local << 16,
            c.bytes_sent_local,
            z.bcopy_sent,
            z.read_zcopy_sent,
            z.write_zcopy_sent,
            z.bcopy_received,
            z.read_zcopy_received,
            z.write_zcopy_received,
            z.src_avails,
            z.sink_avails,
            z.send_sms,
            z.cancels,
            z.mode_changes,
            c.bytes_sent_direct,
            c.bytes_staged,
            c.bytes_received_direct,
            c.bytes_copied_from_pool,
            c.bytes_copied_back,
            self.send_credit as u64,
            self.remote_credit as u64,
            c.bytes_received_local,
            // Counts that stop at u32::MAX, a word for both.
            self.waits_polled.min(u64::from(u32::MAX))
                | self.waits_slept.min(u64::from(u32::MAX)) << 32,
        ]
    }

    fn from_fields(f: [u64; FIELDS]) -> Snapshot {
        Snapshot {
            send_mode: mode_of(f[0] & 0xff),
            recv_mode: mode_of(f[0] >> 8 & 0xff),
            zcopy: ZcopyStats {
                bcopy_sent: f[2],
                read_zcopy_sent: f[3],
                write_zcopy_sent: f[4],
                bcopy_received: f[5],
                read_zcopy_received: f[6],
                write_zcopy_received: f[7],
                src_avails: f[8],
                sink_avails: f[9],
                send_sms: f[10],
                cancels: f[11],
                mode_changes: f[12],
            },
            copies: CopyStats {
                bytes_sent_direct: f[13],
                bytes_staged: f[14],
                bytes_received_direct: f[15],
                bytes_copied_from_pool: f[16],
                bytes_copied_back: f[17],
                bytes_sent_local: f[1],
                bytes_received_local: f[20],
            },
            send_credit: f[18] as i64,
            remote_credit: f[19] as i64,
            local: f[0] >> 16 & 0xff_ffff,
            waits_polled: f[21] & 0xffff_ffff,
            waits_slept: f[21] >> 32,
        }
    }
}

impl Counters {
    /// Copies `s` in. Only the holder of the stream's lock stores, so
    /// stores never overlap.
    pub fn store(&self, s: Snapshot) {
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (cell, v) in self.fields.iter().zip(s.to_fields()) {
            cell.store(v, Ordering::Relaxed);
        }
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The figures of the last store, whole. A store that never ends (a
    /// child of `fork` whose parent thread was inside one) is given up on
    /// after [`PATIENCE`]: the figures are then as they lie.
    pub fn load(&self) -> Snapshot {
        let mut f = [0u64; FIELDS];
        let mut waiting_since = None;
        for look in 0.. {
            let before = self.seq.load(Ordering::Acquire);
            for (v, cell) in f.iter_mut().zip(&self.fields) {
                *v = cell.load(Ordering::Relaxed);
            }
            fence(Ordering::Acquire);
            if before.is_multiple_of(2) && self.seq.load(Ordering::Relaxed) == before {
                break;
            }
            if look < SPINS {
                std::hint::spin_loop();
                continue;
            }
            let since = *waiting_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() > PATIENCE {
                break;
            }
            std::thread::yield_now();
        }
        Snapshot::from_fields(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_comes_back_as_stored() {
        let c = Counters::default();
        assert_eq!(c.load(), Snapshot::default());
        let s = Snapshot {
            send_mode: Some(FlowControlMode::Pipelined),
            recv_mode: Some(FlowControlMode::Buffered),
            zcopy: ZcopyStats {
                bcopy_sent: 1,
                read_zcopy_sent: 2,
                write_zcopy_sent: 3,
                bcopy_received: 4,
                read_zcopy_received: 5,
                write_zcopy_received: 6,
                src_avails: 7,
                sink_avails: 8,
                send_sms: 9,
                cancels: 10,
                mode_changes: 11,
            },
            copies: CopyStats {
                bytes_sent_direct: 12,
                bytes_staged: 13,
                bytes_received_direct: 14,
                bytes_copied_from_pool: 15,
                bytes_copied_back: 16,
                bytes_sent_local: 18,
                bytes_received_local: 19,
            },
            send_credit: -1,
            remote_credit: 17,
            local: 20,
            waits_polled: 21,
            waits_slept: 22,
        };
        c.store(s);
        assert_eq!(c.load(), s);
    }

    /// A reader racing a writer sees one store or another, never a mix:
    /// every field of a store carries the same number.
    #[test]
    fn a_reader_never_sees_half_a_store() {
        let c = std::sync::Arc::new(Counters::default());
        let w = c.clone();
        let writer = std::thread::spawn(move || {
            for n in 1..=5_000u64 {
                let copies = CopyStats {
                    bytes_sent_direct: n,
                    bytes_staged: n,
                    bytes_received_direct: n,
                    bytes_copied_from_pool: n,
                    bytes_copied_back: n,
                    bytes_sent_local: n,
                    bytes_received_local: n,
                };
                w.store(Snapshot {
                    copies,
                    send_credit: n as i64,
                    remote_credit: n as i64,
                    ..Snapshot::default()
                });
                // Stores come a call apart in a stream, not back to back.
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        });
        let mut seen = 0;
        while seen < 5_000 {
            let s = c.load();
            let n = s.copies.bytes_sent_direct;
            assert!(n >= seen, "went back from {seen} to {n}");
            assert_eq!(
                [
                    s.copies.bytes_staged,
                    s.copies.bytes_received_direct,
                    s.copies.bytes_copied_from_pool,
                    s.copies.bytes_copied_back,
                    s.send_credit as u64,
                    s.remote_credit as u64,
                ],
                [n; 6]
            );
            seen = n;
        }
        writer.join().unwrap();
    }
}
