//! Receive overlays: part of the next posted receive buffer placed into
//! other memory for a while — a reader's buffer lent for the length of one
//! call (DESIGN §7: "payload lands in the application buffer directly when
//! a receive is waiting").
//!
//! The engine keeps placing in the receive buffer's coordinates (region,
//! offset); only where the bytes land is translated, in
//! [`DataPath::recv_target`], [`DataPath::placed`] and the copying path of
//! [`DataPath::handle_input`]. Runs are cut at the overlay's edges, and the
//! CRC is computed over the octets where they land, as always. Only
//! untagged placements (Sends) are translated: tagged ones go to
//! registered memory, which a receive buffer never is.
//!
//! A message that placed nothing through the overlay (no payload that far)
//! passes it on to the next receive; one that did is *done*
//! ([`DataPath::take_overlay_done`], with its completion), and if it fit, the
//! next receive's payload goes right behind it. The caller takes an overlay
//! back ([`DataPath::take_overlay`]) when the
//! message completes or before the lent memory goes; if the message is
//! not whole by then, it copies the octets placed so far
//! ([`RecvOverlay::placed`]) to the receive buffer and placement goes on
//! there as if nothing had happened.
//!
//! ```
//! use iwarp::engine::{DataPath, Params, Payload, RecvWr, SendKind, SendWr, Sge};
//! use iwarp::mem::{Memory, Pd, VecMemory};
//!
//! let (mut a, mut b) = (DataPath::new(Pd(1), 1), DataPath::new(Pd(1), 2));
//! a.enable(Params::default());
//! b.enable(Params::default());
//! let (mut ma, mut mb) = (VecMemory::new(), VecMemory::new());
//! let src = ma.add(b"hdr:payload".to_vec());
//! let buf = mb.add(vec![0; 64]);
//! let reader = mb.add(vec![0; 16]);
//! b.post_recv(RecvWr { wr_id: 7, sge: Sge { region: buf, offset: 0, len: 64 } }).unwrap();
//! // Octets 4.. of the next message go to `reader`.
//! assert_eq!(b.overlay_next_recv(4, reader, 0, 16), Some(7));
//! a.post_send(SendWr { wr_id: 1, kind: SendKind::Send, payload: Payload::region(src, 0, 11), signaled: true })
//!     .unwrap();
//! a.poll_transmit(&ma, 1 << 20);
//! let mut wire = Vec::new();
//! a.txq().for_each_slice(&ma, |s| { wire.extend_from_slice(s); true }).unwrap();
//! b.handle_input(&wire, &mut mb);
//! assert_eq!(b.poll_completion().unwrap().byte_len, 11);
//! let ov = b.take_overlay_done(7).unwrap();
//! assert_eq!(ov.placed, 7);
//! assert_eq!(&mb.region(buf).unwrap()[..4], b"hdr:");
//! assert_eq!(&mb.region(reader).unwrap()[..7], b"payload");
//! ```

use crate::mem::RegionId;

pub use super::placement::RecvOverlay;
use super::placement::Target;
use super::qp::{DataPath, State};
use super::wr::Sge;

/// Where one run of placement lands.
pub(crate) struct Landing {
    pub region: RegionId,
    pub offset: usize,
    /// Octets of the run that land there contiguously (at most asked).
    pub len: usize,
    /// Through the overlay.
    pub overlaid: bool,
    /// In the range of a parked overlay.
    pub parked: bool,
}

impl DataPath {
    /// Places octets `skip..skip + len` of the next message's receive
    /// buffer into `to` at `to_offset` instead, until taken back with
    /// [`DataPath::take_overlay`]; returns the receive's `wr_id`. `None`
    /// (nothing set) unless the stream is in [`State::Rts`] and a receive
    /// is posted.
    ///
    /// The next message may be under way, part of it placed in its
    /// receive buffer already: the overlay then starts parked, as if the
    /// caller had been away since it began ([`DataPath::park_overlay`]),
    /// and the caller catches those octets up with
    /// [`DataPath::resume_overlay`]. `None` if they reach the overlay's end
    /// (nothing would land through it).
    pub fn overlay_next_recv(
        &mut self,
        skip: usize,
        to: RegionId,
        to_offset: usize,
        len: usize,
    ) -> Option<u64> {
        if self.state != State::Rts || self.rx.dropping {
            return None;
        }
        // The message under way, and the end of what it placed so far.
        let (wr, end) = match (&self.rx.send, self.rx.seg.target) {
            (
                Some(p),
                Target::Place {
                    stag: None, offset, ..
                },
            ) => (p.wr, offset),
            (Some(p), _) => (p.wr, p.end),
            (None, target) => {
                let wr = *self.rx.rq.front()?;
                match target {
                    // Its first segment is being placed.
                    Target::Place {
                        stag: None, offset, ..
                    } => (wr, offset),
                    _ => (wr, wr.sge.offset),
                }
            }
        };
        let room = wr.sge.len.checked_sub(skip)?;
        let from = Sge {
            region: wr.sge.region,
            offset: wr.sge.offset.checked_add(skip)?,
            len: room.min(len),
        };
        if from.len == 0 || end >= from.offset + from.len {
            return None;
        }
        self.rx.overlay = Some(RecvOverlay {
            wr_id: wr.wr_id,
            from,
            to,
            to_offset,
            skip,
            placed: 0,
            active: end <= from.offset,
            parked_end: end.max(from.offset),
        });
        Some(wr.wr_id)
    }

    /// The overlay, if one is set.
    pub fn overlay(&self) -> Option<&RecvOverlay> {
        self.rx.overlay.as_ref()
    }

    /// The message of `msg_len` octets into receive `wr_id` was delivered.
    /// If nothing of it landed through the overlay (a message without
    /// payload there, such as a credit update), the overlay moves on to the
    /// next receive: the payload the caller waits for is still to come.
    /// Otherwise the overlay is done ([`DataPath::take_overlay_done`]); if
    /// the message fit and the target has room left, a new overlay goes on
    /// for the next receive right behind it, so that consecutive messages
    /// land one after the other.
    pub(crate) fn overlay_delivered(&mut self, wr_id: u64, msg_len: usize) {
        let Some(ov) = self.rx.overlay else {
            return;
        };
        if ov.wr_id != wr_id {
            return;
        }
        self.rx.overlay = None;
        let (skip, to, len) = (ov.skip, ov.to, ov.from.len);
        if ov.placed == 0 && ov.parked_end <= ov.from.offset {
            self.overlay_next_recv(skip, to, ov.to_offset, len);
            if let Some(next) = &mut self.rx.overlay {
                next.active = ov.active;
            }
            return;
        }
        self.rx.overlays_done.push_back(ov);
        let used = msg_len.saturating_sub(skip);
        if ov.active && used <= len && used > 0 && ov.placed == used {
            self.overlay_next_recv(skip, to, ov.to_offset.saturating_add(used), len - used);
        }
    }

    /// The overlay of receive `wr_id`, if its message was delivered with
    /// octets in the overlay (oldest first; `None` if the oldest is
    /// another receive's).
    pub fn take_overlay_done(&mut self, wr_id: u64) -> Option<RecvOverlay> {
        if self.rx.overlays_done.front()?.wr_id != wr_id {
            return None;
        }
        self.rx.overlays_done.pop_front()
    }

    /// Overlays done and not yet taken: 0 once every completion was
    /// polled and its overlay taken.
    pub fn overlays_done(&self) -> usize {
        self.rx.overlays_done.len()
    }

    /// Removes the oldest overlay, done or not: called until `None`, the
    /// caller takes its memory back. (One at a time, so that a reader's
    /// call that ends allocates nothing.)
    pub fn take_next_overlay(&mut self) -> Option<RecvOverlay> {
        self.rx
            .overlays_done
            .pop_front()
            .or_else(|| self.rx.overlay.take())
    }

    /// Stops translating: octets land in the receive buffer again, as the
    /// caller's memory is not there for a while (it keeps what was placed
    /// in it so far).
    pub fn park_overlay(&mut self) {
        if let Some(ov) = &mut self.rx.overlay {
            ov.active = false;
        }
    }

    /// Translates again after [`DataPath::park_overlay`]. Returns the
    /// octets of the receive buffer (an offset of `from.region` and a
    /// length) that landed there meanwhile: the caller copies them to the
    /// overlay target at `to_offset + placed` (the old value), so that the
    /// target holds the message from its start again; `placed` covers them.
    pub fn resume_overlay(&mut self) -> Option<(usize, usize)> {
        let ov = self.rx.overlay.as_mut()?;
        ov.active = true;
        let from = ov.from.offset.saturating_add(ov.placed);
        let n = ov.parked_end.saturating_sub(from);
        ov.placed = ov.placed.saturating_add(n);
        ov.parked_end = ov.from.offset;
        Some((from, n))
    }

    /// Removes the overlay and returns it (with how far it was placed).
    pub fn take_overlay(&mut self) -> Option<RecvOverlay> {
        self.rx.overlay.take()
    }

    /// Where up to `len` octets of an untagged placement at `offset` of
    /// `region` land.
    pub(crate) fn landing(&self, region: RegionId, offset: usize, len: usize) -> Landing {
        let direct = Landing {
            region,
            offset,
            len,
            overlaid: false,
            parked: false,
        };
        let Some(ov) = &self.rx.overlay else {
            return direct;
        };
        if region != ov.from.region {
            return direct;
        }
        let start = ov.from.offset;
        let end = start.saturating_add(ov.from.len);
        if (start..end).contains(&offset) && !ov.active {
            Landing {
                len: len.min(end - offset),
                parked: true,
                ..direct
            }
        } else if (start..end).contains(&offset) {
            Landing {
                region: ov.to,
                offset: ov.to_offset.saturating_add(offset - start),
                len: len.min(end - offset),
                overlaid: true,
                parked: false,
            }
        } else if offset < start && offset.saturating_add(len) > start {
            Landing {
                len: start - offset,
                ..direct
            }
        } else {
            direct
        }
    }

    /// Records `n` octets placed at landing `l`.
    pub(crate) fn overlay_placed(&mut self, l: &Landing, n: usize) {
        let end = l.offset.saturating_add(n);
        if let Some(ov) = &mut self.rx.overlay {
            if l.overlaid {
                ov.placed = ov.placed.max(end.saturating_sub(ov.to_offset));
            } else if l.parked {
                ov.parked_end = ov.parked_end.max(end);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Params, Payload, RecvTarget, RecvWr, SendKind, SendWr};
    use crate::mem::{Memory, Pd, VecMemory};

    /// Feeds `wire` to `dp` in chunks of `step` octets the way a driver
    /// does: straight into place where the engine says so.
    fn feed(dp: &mut DataPath, wire: &[u8], mem: &mut VecMemory, step: usize) {
        let mut at = 0;
        while at < wire.len() {
            let n = step.min(wire.len() - at);
            match dp.recv_target() {
                RecvTarget::Place {
                    region,
                    offset,
                    len,
                } => {
                    let k = n.min(len);
                    let dst = &mut mem.region_mut(region).unwrap()[offset..offset + k];
                    dst.copy_from_slice(&wire[at..at + k]);
                    dp.placed(k, mem);
                    at += k;
                }
                RecvTarget::Scratch { max } => {
                    let k = n.min(max.max(1));
                    assert_eq!(dp.handle_input(&wire[at..at + k], mem), k);
                    at += k;
                }
            }
        }
    }

    /// Two Sends of 300 and 200 octets, in segments of at most 110 payload
    /// octets (MULPDU 128), with 10 header octets each; the reader's 600
    /// octets take both payloads one after the other. Placement parks in
    /// the middle of the first message (those octets land in the receive
    /// buffer) and resumes, as a reader that sleeps between two pumps.
    #[test]
    fn segments_land_in_the_overlay_across_park_and_chain() {
        for step in [1, 7, 64, 1000] {
            let params = Params {
                emss: 128 + 8,
                ..Params::default()
            };
            let (mut a, mut b) = (DataPath::new(Pd(1), 1), DataPath::new(Pd(1), 2));
            a.enable(params);
            b.enable(params);
            let (mut ma, mut mb) = (VecMemory::new(), VecMemory::new());
            let msgs: Vec<Vec<u8>> = [300usize, 200]
                .iter()
                .enumerate()
                .map(|(m, &len)| (0..len).map(|i| (i * 7 + m * 100) as u8).collect())
                .collect();
            let bufs = [mb.add(vec![0; 512]), mb.add(vec![0; 512])];
            let reader = mb.add(vec![0; 600]);
            for (i, &buf) in bufs.iter().enumerate() {
                let sge = Sge {
                    region: buf,
                    offset: 0,
                    len: 512,
                };
                b.post_recv(RecvWr {
                    wr_id: i as u64,
                    sge,
                })
                .unwrap();
            }
            assert_eq!(b.overlay_next_recv(10, reader, 0, 600), Some(0));
            let mut wire = Vec::new();
            for (i, m) in msgs.iter().enumerate() {
                let src = ma.add(m.clone());
                a.post_send(SendWr {
                    wr_id: i as u64,
                    kind: SendKind::Send,
                    payload: Payload::region(src, 0, m.len()),
                    signaled: true,
                })
                .unwrap();
            }
            a.poll_transmit(&ma, 1 << 20);
            a.txq()
                .for_each_slice(&ma, |s| {
                    wire.extend_from_slice(s);
                    true
                })
                .unwrap();
            // Park after 150 octets of the wire: the first message is under way.
            feed(&mut b, &wire[..150], &mut mb, step);
            b.park_overlay();
            feed(&mut b, &wire[150..250], &mut mb, step);
            let (at, n) = b.resume_overlay().unwrap();
            let ov = *b.overlay().unwrap();
            assert_eq!(ov.placed, at + n - 10, "step {step}");
            // The caller catches up what landed in the receive buffer.
            let caught = mb.region(bufs[0]).unwrap()[at..at + n].to_vec();
            mb.region_mut(reader).unwrap()[at - 10..at - 10 + n].copy_from_slice(&caught);
            feed(&mut b, &wire[250..], &mut mb, step);
            let done: Vec<_> = (0..2).map(|i| b.take_overlay_done(i).unwrap()).collect();
            assert_eq!((done[0].placed, done[1].placed), (290, 190));
            assert_eq!(done[1].to_offset, 290);
            let r = mb.region(reader).unwrap();
            assert_eq!(&r[..290], &msgs[0][10..]);
            assert_eq!(&r[290..480], &msgs[1][10..]);
            assert_eq!(&mb.region(bufs[1]).unwrap()[..10], &msgs[1][..10]);
            for i in 0..2 {
                let c = b.poll_completion().unwrap();
                assert_eq!((c.wr_id, c.byte_len), (i, msgs[i as usize].len() as u32));
            }
            assert!(b.overlay().is_none() && b.overlays_done() == 0);
        }
    }

    /// A receiver with one 512-octet receive posted (`wr_id` 5) and a
    /// 400-octet reader region, and the wire octets of one Send of `msg` in
    /// FPDUs of 136 octets (EMSS): (receiver, its memory, receive buffer,
    /// reader, wire).
    fn one_send(msg: &[u8]) -> (DataPath, VecMemory, RegionId, RegionId, Vec<u8>) {
        let params = Params {
            emss: 128 + 8,
            ..Params::default()
        };
        let (mut a, mut b) = (DataPath::new(Pd(1), 1), DataPath::new(Pd(1), 2));
        a.enable(params);
        b.enable(params);
        let (mut ma, mut mb) = (VecMemory::new(), VecMemory::new());
        let buf = mb.add(vec![0; 512]);
        let reader = mb.add(vec![0; 400]);
        let sge = Sge {
            region: buf,
            offset: 0,
            len: 512,
        };
        b.post_recv(RecvWr { wr_id: 5, sge }).unwrap();
        let src = ma.add(msg.to_vec());
        a.post_send(SendWr {
            wr_id: 1,
            kind: SendKind::Send,
            payload: Payload::region(src, 0, msg.len()),
            signaled: true,
        })
        .unwrap();
        a.poll_transmit(&ma, 1 << 20);
        let mut wire = Vec::new();
        a.txq()
            .for_each_slice(&ma, |s| {
                wire.extend_from_slice(s);
                true
            })
            .unwrap();
        (b, mb, buf, reader, wire)
    }

    /// A reader that comes while a message is under way (part of it placed
    /// in the receive buffer already, mid-segment or between two segments)
    /// gets an overlay that starts parked: it catches up what was placed
    /// and the rest lands in its buffer.
    #[test]
    fn an_overlay_set_while_a_message_is_under_way_catches_up() {
        let msg: Vec<u8> = (0..300usize).map(|i| (i * 13) as u8).collect();
        // Cut in the first FPDU's payload, in its CRC, right after it
        // (between the segments), in the second one.
        for cut in [60, 130, 136, 150, 250] {
            for step in [1, 7, 64, 1000] {
                let (mut b, mut mb, buf, reader, wire) = one_send(&msg);
                feed(&mut b, &wire[..cut], &mut mb, step);
                assert_eq!(b.overlay_next_recv(10, reader, 0, 400), Some(5));
                let ov = *b.overlay().unwrap();
                let (at, n) = b.resume_overlay().unwrap();
                assert!(!ov.active && n > 0, "cut {cut} step {step}");
                let caught = mb.region(buf).unwrap()[at..at + n].to_vec();
                mb.region_mut(reader).unwrap()[..n].copy_from_slice(&caught);
                feed(&mut b, &wire[cut..], &mut mb, step);
                let done = b.take_overlay_done(5).unwrap();
                assert_eq!(done.placed, 290, "cut {cut} step {step}");
                assert_eq!(&mb.region(reader).unwrap()[..290], &msg[10..]);
                assert_eq!(b.poll_completion().unwrap().byte_len, 300);
            }
        }
    }

    /// No overlay when what the message under way placed already reaches
    /// its end: nothing would land through it.
    #[test]
    fn no_overlay_past_what_the_message_placed() {
        let (mut b, mut mb, _, reader, wire) = one_send(&[7; 300]);
        // Past the first segment's 110 payload octets.
        feed(&mut b, &wire[..200], &mut mb, 64);
        assert_eq!(b.overlay_next_recv(10, reader, 0, 50), None);
        assert!(b.overlay().is_none());
        assert_eq!(b.overlay_next_recv(10, reader, 0, 400), Some(5));
    }
}
