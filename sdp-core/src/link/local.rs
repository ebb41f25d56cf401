//! The link's part of the same-host path ([`crate::conn::local`]): the
//! two system calls that touch the peer process's memory. Reading the
//! offer's token back checks it; writing a LocalData's payload into the
//! slot comes before the message that announces it is posted, so the
//! bytes have landed before the peer can learn of them.

use std::io::IoSlice;

use nix::errno::Errno;
use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

use core::ops::Range;

use iwarp::engine::Sge;

use super::{direct, staging, zcopy, Link};
use crate::conn::local::{LocalOff, PeerSlot};
use crate::wire::LocalOfferRepr;

/// The caller's memory lent for one drive: the bytes of a direct send
/// ([`Link::send_direct`]) and of a Zcopy send, where a LocalData's or a
/// same-host RDMA Write's payload may lie, and the Zcopy receive buffer,
/// where a same-host RDMA Read lands.
#[derive(Debug, Default)]
pub struct Lent<'a> {
    /// The direct send's buffers.
    pub send_from: Option<&'a [&'a [u8]]>,
    /// The Zcopy send's buffer.
    pub zc_send: Option<&'a [u8]>,
    /// The Zcopy receive buffer.
    pub zc_recv: Option<&'a mut [u8]>,
}

impl Link {
    /// Writes the payload `range` of the send stream at `at`. `Err(None)`:
    /// its bytes are not at hand in this drive (the message goes inline,
    /// the path stays on); `Err(Some(why))`: the peer refused.
    pub(super) fn write_local(
        &self,
        at: PeerSlot,
        range: Range<u64>,
        lent: &Lent<'_>,
    ) -> Result<(), Option<LocalOff>> {
        let mut sges: Vec<Sge> = Vec::with_capacity(4);
        self.payload_sges(range.clone(), &mut sges);
        let mut parts: Vec<&[u8]> = Vec::with_capacity(sges.len());
        for sge in &sges {
            let region = if sge.region == staging::PAYLOAD_REGION {
                self.staging.region(sge.region)
            } else if sge.region == zcopy::SEND_ZCOPY {
                lent.zc_send
            } else {
                direct::send_from_index(sge.region).and_then(|i| lent.send_from?.get(i).copied())
            };
            let part = region.and_then(|r| r.get(sge.offset..sge.offset.checked_add(sge.len)?));
            parts.push(part.ok_or(None)?);
        }
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if len != range.end - range.start {
            return Err(None);
        }
        write(at, &parts).map_err(Some)
    }
}

/// Checks an offer: its process belongs to our user, and the 4 bytes in
/// front of its ring, read from it, are its token. A process of another
/// user, another kernel's process number or a process gone all fail here,
/// before anything is written. The user is checked here and not left to
/// the kernel: a privileged process may read and write any other (ptrace
/// rights), and a peer must not be able to point it at one (DESIGN §9).
pub fn check(offer: &LocalOfferRepr) -> Result<(), LocalOff> {
    same_user(offer.pid)?;
    token_holds(offer.pid, offer.ring, offer.token)
}

/// Whether process `pid` runs as our effective user: the owner of its
/// `/proc` entry (root's for a process that made itself undumpable, which
/// is refused too).
fn same_user(pid: u32) -> Result<(), LocalOff> {
    use std::os::unix::fs::MetadataExt;
    let owner = std::fs::metadata(format!("/proc/{pid}"))
        .map_err(|_| LocalOff::Gone)?
        .uid();
    if owner == rustix::process::geteuid().as_raw() {
        Ok(())
    } else {
        Err(LocalOff::Refused(Errno::EPERM as i32))
    }
}

fn token_holds(pid: u32, ring: u64, token: u32) -> Result<(), LocalOff> {
    let mut got = [0u8; 4];
    let at = ring.checked_sub(4).ok_or(LocalOff::BadOffer)?;
    let remote = [RemoteIoVec {
        base: usize::try_from(at).map_err(|_| LocalOff::BadOffer)?,
        len: got.len(),
    }];
    let pid = Pid::from_raw(i32::try_from(pid).map_err(|_| LocalOff::BadOffer)?);
    let n = process_vm_readv(pid, &mut [std::io::IoSliceMut::new(&mut got)], &remote)
        .map_err(refusal)?;
    if n == got.len() && u32::from_ne_bytes(got) == token {
        Ok(())
    } else {
        Err(LocalOff::OtherHost)
    }
}

/// Writes `parts` (their concatenation) at `at`, then reads the offer's
/// token back: all of it landed in the ring of the process that offered
/// it (not in a copy a `fork` left behind, see [`Ring`]), or an error.
///
/// [`Ring`]: crate::conn::local::Ring
pub fn write(at: PeerSlot, parts: &[&[u8]]) -> Result<(), LocalOff> {
    put(at, parts)?;
    token_holds(at.pid, at.ring, at.token)
}

/// Reads `into.len()` bytes at `from` in the peer process into `into`,
/// then the token of its ring, in one call: the kernel copies the remote
/// ranges in order, so a token that still holds proves every byte came
/// from the process that offered the ring (a `fork` revokes it first).
pub fn read(peer: PeerSlot, from: u64, into: &mut [u8]) -> Result<(), LocalOff> {
    let mut got = [0u8; 4];
    let len = into.len();
    let at = |base: u64| usize::try_from(base).map_err(|_| LocalOff::BadOffer);
    let remote = [
        RemoteIoVec {
            base: at(from)?,
            len,
        },
        RemoteIoVec {
            base: at(peer.ring.checked_sub(4).ok_or(LocalOff::BadOffer)?)?,
            len: got.len(),
        },
    ];
    let pid = Pid::from_raw(i32::try_from(peer.pid).map_err(|_| LocalOff::BadOffer)?);
    let mut local = [
        std::io::IoSliceMut::new(into),
        std::io::IoSliceMut::new(&mut got),
    ];
    match process_vm_readv(pid, &mut local, &remote) {
        Ok(n) if n == len + got.len() && u32::from_ne_bytes(got) == peer.token => Ok(()),
        Ok(n) if n == len + got.len() => Err(LocalOff::OtherHost),
        // A partial read means part of the range is not mapped.
        Ok(_) => Err(LocalOff::BadOffer),
        Err(e) => Err(refusal(e)),
    }
}

fn put(at: PeerSlot, parts: &[&[u8]]) -> Result<(), LocalOff> {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let local: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
    let remote = [RemoteIoVec {
        base: usize::try_from(at.addr).map_err(|_| LocalOff::BadOffer)?,
        len,
    }];
    let pid = Pid::from_raw(i32::try_from(at.pid).map_err(|_| LocalOff::BadOffer)?);
    match process_vm_writev(pid, &local, &remote) {
        Ok(n) if n == len => Ok(()),
        // A partial write means part of the slot is not mapped.
        Ok(_) => Err(LocalOff::BadOffer),
        Err(e) => Err(refusal(e)),
    }
}

fn refusal(e: Errno) -> LocalOff {
    match e {
        Errno::ESRCH => LocalOff::Gone,
        Errno::EFAULT => LocalOff::BadOffer,
        e => LocalOff::Refused(e as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conn::local::Ring;

    #[test]
    fn an_offer_of_this_process_checks_and_takes_writes() {
        let ring = Ring::open(2, 4096).unwrap();
        let offer = ring.offer;
        assert_eq!(check(&offer), Ok(()));
        let at = PeerSlot {
            pid: offer.pid,
            addr: offer.ring + 4096,
            ring: offer.ring,
            token: offer.token,
        };
        assert_eq!(write(at, &[b"abc", b"def"]), Ok(()));
        assert_eq!(ring.slot(1, 0..6).unwrap(), b"abcdef");
    }

    #[test]
    fn a_revoked_ring_refuses_the_write_that_follows() {
        let mut ring = Ring::open(2, 4096).unwrap();
        let offer = ring.offer;
        let at = PeerSlot {
            pid: offer.pid,
            addr: offer.ring,
            ring: offer.ring,
            token: offer.token,
        };
        ring.revoke();
        assert_eq!(write(at, &[b"abc"]), Err(LocalOff::OtherHost));
        assert_eq!(check(&offer), Err(LocalOff::OtherHost));
    }

    #[test]
    fn a_forged_offer_is_refused() {
        let ring = Ring::open(2, 4096).unwrap();
        let offer = ring.offer;
        // Right process and address, wrong token: not this ring.
        let wrong = LocalOfferRepr {
            token: offer.token ^ 1,
            ..offer
        };
        assert_eq!(check(&wrong), Err(LocalOff::OtherHost));
        // Memory that is not mapped.
        let unmapped = LocalOfferRepr { ring: 16, ..offer };
        assert_eq!(check(&unmapped), Err(LocalOff::BadOffer));
        // No such process (pid_max is at most 2^22).
        let gone = LocalOfferRepr {
            pid: (1 << 22) + 1,
            ..offer
        };
        assert_eq!(check(&gone), Err(LocalOff::Gone));
    }

    use iwarp::engine::{Payload, SendKind as QpSendKind, SendWr};

    use std::time::Duration;

    use crate::conn::local::{self, LOCAL_MIN, OFFER_AFTER};
    use crate::conn::{CloseReason, Config};
    use crate::link::pair::LinkPair;
    use crate::verbs::Teardown;
    use crate::wire::{Body, Flags, LocalDataRepr, MessageRepr};

    fn same_host() -> Config {
        Config {
            bufs: 8,
            buf_size: 64 * 1024,
            local: true,
            ..Config::default()
        }
    }

    /// Both ways at once, hashes compared, then a graceful close.
    fn transfer(a: &Config, b: &Config, bytes: u64) -> LinkPair {
        let mut pair = LinkPair::connected(a, b, 61);
        pair.max_chunk = 256 * 1024;
        for app in &mut pair.apps {
            app.to_write = bytes;
            app.max_io = 200_000;
            app.shutdown_when_done = true;
        }
        assert!(pair.run(u64::MAX, |p| p.apps.iter().all(|a| a.eof)));
        for s in 0..2 {
            assert_eq!(pair.apps[s].read, bytes);
            assert_eq!(pair.apps[s].read_hash, pair.apps[1 - s].write_hash);
            assert!(pair.apps[s].errors.is_empty(), "{:?}", pair.apps[s].errors);
        }
        assert!(pair.settle(1_000_000));
        for s in 0..2 {
            assert_eq!(
                pair.sides[s].link().close_reason(),
                Some(&CloseReason::Graceful)
            );
        }
        pair
    }

    #[test]
    fn a_stream_goes_through_the_peers_ring_and_hashes_equal() {
        let bytes = 8 << 20;
        let mut pair = transfer(&same_host(), &same_host(), bytes);
        for s in 0..2 {
            let sent = pair.sides[s].link().copy_stats().bytes_sent_local;
            let got = pair.sides[1 - s].link().copy_stats().bytes_received_local;
            assert_eq!(sent, got, "side {s}");
            // All but the first OFFER_AFTER bytes and the odd short
            // message went through the ring.
            assert!(
                sent > bytes / 2,
                "side {s}: {sent} of {bytes} through the ring"
            );
            assert_eq!(pair.sides[s].link().conn().local_state(), (Ok(()), true));
        }
    }

    /// A reader whose Private Buffers are smaller than a LocalData's least
    /// payload (a program's small SO_RCVBUF: 3 of 2 730 bytes) gets Data
    /// Messages of at most a buffer where the bytes waiting do not make a
    /// LocalData — never one longer than its buffer, which it would refuse
    /// with a Terminate (CPython's test_asyncio.test_sendfile did that).
    #[test]
    fn a_reader_with_small_buffers_gets_no_message_longer_than_one() {
        let small = Config {
            bufs: 3,
            buf_size: 2730,
            ..same_host()
        };
        // The writer's SO_SNDBUF is small too: its send buffer never
        // holds a LocalData's worth.
        let writer = Config {
            send_buffer: 8192,
            ..same_host()
        };
        let mut pair = LinkPair::connected(&writer, &small, 65);
        pair.max_chunk = 256 * 1024;
        pair.apps[0].to_write = 4 << 20;
        pair.apps[0].max_io = 5000;
        pair.apps[0].exact_writes = true;
        pair.apps[0].shutdown_when_done = true;
        pair.apps[1].max_io = 3000;
        pair.apps[1].shutdown_when_done = true;
        assert!(pair.run(u64::MAX, |p| p.apps[1].eof));
        assert_eq!(pair.apps[1].read, 4 << 20);
        assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
        assert!(pair.settle(1_000_000));
        for s in 0..2 {
            let link = pair.sides[s].link();
            let log: Vec<String> = link.log_lines().map(str::to_string).collect();
            assert_eq!(
                link.close_reason(),
                Some(&CloseReason::Graceful),
                "side {s}: {log:?}"
            );
        }
    }

    /// Messages side 0 sent to move `bytes` in writes of 64 KiB, a
    /// Private Buffer's worth, with writes held back for `coalesce`.
    fn messages_for_64k_writes(coalesce: Duration, bytes: u64) -> (u32, u64) {
        let c = Config {
            coalesce,
            ..same_host()
        };
        let mut pair = LinkPair::connected(&c, &c, 64);
        pair.max_chunk = 256 * 1024;
        pair.apps[0].to_write = bytes;
        pair.apps[0].max_io = 64 * 1024;
        pair.apps[0].exact_writes = true;
        pair.apps[0].shutdown_when_done = true;
        pair.apps[1].max_io = 1 << 20;
        let before = pair.sides[0].link().credit_state().lsseq;
        assert!(pair.run(u64::MAX, |p| p.apps[1].eof));
        assert_eq!(pair.apps[1].read, bytes);
        assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
        let link = pair.sides[0].link();
        let messages = link.credit_state().lsseq.wrapping_sub(before);
        (messages, link.copy_stats().bytes_sent_local)
    }

    /// A LocalData carries up to a slot (256 KiB): while an earlier
    /// message of ours is unread, a write of a Private Buffer's worth
    /// waits for the next to fill the slot, as a short tail does
    /// (autocorking). Without the wait each write is its own message.
    #[test]
    fn message_sized_writes_fill_a_slot_while_a_message_is_unread() {
        let bytes = 16 << 20;
        let (alone, local_alone) = messages_for_64k_writes(Duration::ZERO, bytes);
        let (filled, local_filled) = messages_for_64k_writes(Duration::from_secs(1), bytes);
        assert!(local_alone > bytes / 2 && local_filled > bytes / 2);
        let writes = (bytes / (64 * 1024)) as u32;
        assert!(
            alone >= writes * 3 / 4,
            "{alone} messages for {writes} writes"
        );
        assert!(filled <= alone / 2, "{filled} messages against {alone}");
    }

    /// An offer naming a process of another user is refused before any
    /// read or write of it, whatever the token: as root (ptrace rights
    /// over every process) a process of `nobody` started for the test,
    /// otherwise process 1 (root's).
    #[test]
    fn an_offer_of_another_users_process_is_refused() {
        use std::os::unix::process::CommandExt;
        let root = rustix::process::geteuid().is_root();
        let mut child = root.then(|| {
            std::process::Command::new("sleep")
                .arg("30")
                .uid(65534)
                .gid(65534)
                .spawn()
                .expect("a process of nobody")
        });
        let pid = child.as_ref().map_or(1, std::process::Child::id);
        let offer = crate::wire::LocalOfferRepr {
            pid,
            slot_size: 256 * 1024,
            slots: 4,
            ring: 4096,
            token: 0,
        };
        let r = check(&offer);
        if let Some(c) = child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert_eq!(r, Err(LocalOff::Refused(Errno::EPERM as i32)));
        // Our own process passes the user check (its token is another
        // matter).
        assert_eq!(same_user(std::process::id()), Ok(()));
    }

    #[test]
    fn a_ring_revoked_mid_stream_sends_the_rest_on_the_wire_with_nothing_lost() {
        let c = same_host();
        let mut pair = LinkPair::connected(&c, &c, 63);
        pair.max_chunk = 256 * 1024;
        let bytes = 16 << 20;
        pair.apps[0].to_write = bytes;
        pair.apps[0].max_io = 600_000;
        pair.apps[0].shutdown_when_done = true;
        // Until slots larger than a Private Buffer carry the stream.
        assert!(pair.run(u64::MAX, |p| {
            p.sides[0]
                .link
                .as_ref()
                .is_some_and(|l| l.copy_stats().bytes_sent_local > 4 * u64::from(c.buf_size))
        }));
        pair.sides[1].link().conn_mut().local_revoke();
        pair.apps[1].shutdown_when_done = true;
        assert!(pair.run(u64::MAX, |p| p.apps.iter().all(|a| a.eof)));
        assert_eq!(pair.apps[1].read, bytes);
        assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
        let (send, _) = pair.sides[0].link().conn().local_state();
        assert_eq!(send, Err(LocalOff::OtherHost));
        assert!(pair.settle(1_000_000));
        assert_eq!(
            pair.sides[1].link().close_reason(),
            Some(&CloseReason::Graceful)
        );
    }

    #[test]
    fn a_peer_that_does_not_speak_it_sees_none_of_it() {
        let plain = Config {
            local: false,
            ..same_host()
        };
        for (a, b) in [(same_host(), plain.clone()), (plain.clone(), same_host())] {
            let mut pair = transfer(&a, &b, 2 << 20);
            for s in 0..2 {
                let st = pair.sides[s].link().copy_stats();
                assert_eq!((st.bytes_sent_local, st.bytes_received_local), (0, 0));
                let (send, ring) = pair.sides[s].link().conn().local_state();
                assert!(send.is_err() && !ring);
            }
        }
    }

    /// Side 1 offers its ring (side 0 sent it enough), then side 0 turns
    /// hostile and sends `forged` as a real Send; side 1 must refuse it.
    fn refused(forged: impl FnOnce(u32, u32, u16) -> MessageRepr<'static>) {
        let c = same_host();
        let mut pair = LinkPair::connected(&c, &c, 62);
        pair.apps[0].to_write = OFFER_AFTER + 4 * LOCAL_MIN;
        pair.apps[0].max_io = 64 * 1024;
        let target = pair.apps[0].to_write;
        assert!(pair.run(u64::MAX, |p| p.apps[1].read == target));
        assert!(pair.settle(100_000));
        assert!(
            pair.sides[1].link().conn().local_state().1,
            "no ring offered"
        );
        pair.apps[1].reading = false;
        let side = &mut pair.sides[0];
        side.hostile = true;
        let cs = side.link().credit_state();
        let msg = forged(cs.lsseq.wrapping_add(1), cs.mseq_ack, cs.bufs);
        let mut bytes = vec![0; msg.buffer_len()];
        msg.emit(&mut bytes);
        side.qp
            .datapath_mut()
            .post_send(SendWr {
                wr_id: 1000,
                kind: QpSendKind::Send,
                payload: Payload::Inline(bytes),
                signaled: false,
            })
            .unwrap();
        assert!(pair.settle(100_000));
        let victim = pair.sides[1].link();
        assert_eq!(victim.teardown(), Some(Teardown::Abortive));
        let lines: Vec<String> = victim.log_lines().map(str::to_string).collect();
        assert!(
            lines.iter().any(|l| l.contains("same-host extension")),
            "{lines:?}"
        );
    }

    fn local_data(mseq: u32, ack: u32, bufs: u16, ldh: LocalDataRepr) -> MessageRepr<'static> {
        MessageRepr {
            bufs,
            flags: Flags::EMPTY,
            mseq,
            mseq_ack: ack,
            body: Body::LocalData(ldh),
        }
    }

    #[test]
    fn a_local_data_out_of_turn_or_past_its_slot_is_refused() {
        let slot_size = same_host().buf_size.max(local::SLOT_MIN);
        // The sender used no slot yet: slot 0 is next, not 3.
        refused(|m, a, b| local_data(m, a, b, LocalDataRepr { len: 100, slot: 3 }));
        refused(|m, a, b| {
            local_data(
                m,
                a,
                b,
                LocalDataRepr {
                    len: slot_size + 1,
                    slot: 0,
                },
            )
        });
        refused(|m, a, b| local_data(m, a, b, LocalDataRepr { len: 0, slot: 0 }));
    }

    #[test]
    fn the_state_code_names_each_reason() {
        for send in [
            Ok(()),
            Err(LocalOff::NotOffered),
            Err(LocalOff::Disabled),
            Err(LocalOff::OtherHost),
            Err(LocalOff::Gone),
            Err(LocalOff::BadOffer),
            Err(LocalOff::Refused(1)),
        ] {
            for ring in [false, true] {
                assert_eq!(local::decode(local::code((send, ring))), (send, ring));
            }
        }
    }
}
