//! The Data Source: RDMAP messages segmented into DDP segments (RFC 5041
//! §5.2) and framed as FPDUs with markers and CRC (RFC 5044 §4.1–§4.4),
//! straight into the [`TxQueue`] gather list.
//!
//! Each FPDU is written in one pass: the engine-made octets go into the
//! queue's buffer, payload in registered memory is referenced, and the CRC
//! runs over every octet in wire order where it lies. The geometry (where
//! markers fall, pad) is the same as [`crate::wire::fpdu::Layout`]'s; the
//! tests check the output against [`crate::wire::fpdu::FpduRepr`] byte for
//! byte.

use crate::mem::{Memory, RegionId};
use crate::wire::crc::{self, Crc, CRC_LEN};
use crate::wire::ddp::{BufferModel, QueueNumber, Stag};
use crate::wire::fpdu::{self, HEADER_LEN, MARKER_LEN};
use crate::wire::rdmap::{Opcode, RdmapRepr, ReadRequestRepr};

use super::rebase::{self, Rebase};
use super::txq::{Mark, MissingRegion, TxQueue};
use super::wr::{Payload, Sge};

/// Largest header of one DDP segment: untagged DDP header plus the RDMA
/// Read Request header.
pub(crate) const MAX_HEADER_LEN: usize = 18 + 28;

/// The transmit half of the MPA stream: stream position and framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Framer {
    /// Octets sent since the Full Operation Phase began (RFC 5044 §4.3).
    pub pos: u64,
    pub markers: bool,
    pub crc: bool,
}

impl Framer {
    /// Starts an FPDU carrying `ulpdu_len` octets.
    pub fn begin<'q>(&'q mut self, q: &'q mut TxQueue, ulpdu_len: u16) -> FpduWriter<'q> {
        let mut w = FpduWriter {
            framer: self,
            q,
            header_pos: 0,
            crc: Crc::new(),
            ulpdu_len,
            written: 0,
        };
        let pos = w.framer.pos;
        w.header_pos = pos
            + if w.framer.markers && fpdu::bytes_to_marker(pos) == 0 {
                MARKER_LEN as u64
            } else {
                0
            };
        w.put_bytes(&ulpdu_len.to_be_bytes());
        w
    }
}

/// Writes one FPDU, inserting markers where the stream position calls for
/// them.
pub(crate) struct FpduWriter<'q> {
    framer: &'q mut Framer,
    q: &'q mut TxQueue,
    /// Stream position of the ULPDU_Length field.
    header_pos: u64,
    crc: Crc,
    ulpdu_len: u16,
    /// ULPDU octets written.
    written: usize,
}

impl FpduWriter<'_> {
    /// Octets until the next marker position, or `usize::MAX` without
    /// markers; writes the marker first when one is due.
    fn room(&mut self) -> usize {
        if !self.framer.markers {
            return usize::MAX;
        }
        let pos = self.framer.pos;
        if fpdu::bytes_to_marker(pos) == 0 {
            // RFC 5044 §4.3: FPDUPTR is "the number of octets in the TCP
            // stream from the beginning of the ULPDU Length field to the
            // first octet of the Marker"; 0 for one in front of the field.
            // Truncation as in Layout: an FPDU fits a TCP segment.
            let fpduptr = pos.saturating_sub(self.header_pos) as u16;
            let [hi, lo] = fpduptr.to_be_bytes();
            // RFC 5044 §4.2: the reserved half "MUST be set to zero on
            // transmit".
            let marker = [0, 0, hi, lo];
            // RFC 5044 §4.4: markers are covered by the CRC.
            self.crc.update(&marker);
            self.q.push_bytes(&marker);
            self.framer.pos += MARKER_LEN as u64;
        }
        fpdu::bytes_to_marker(self.framer.pos)
    }

    fn put_bytes_inner(&mut self, mut data: &[u8], covered: bool) {
        while !data.is_empty() {
            let n = self.room().min(data.len());
            let (now, rest) = data.split_at(n);
            if covered {
                self.crc.update(now);
            }
            self.q.push_bytes(now);
            self.framer.pos += n as u64;
            data = rest;
        }
    }

    /// Writes engine-made octets (header, inline payload).
    pub fn put_bytes(&mut self, data: &[u8]) {
        self.put_bytes_inner(data, true);
        self.written += data.len();
    }

    /// References `len` octets of `region` from `offset`; the CRC runs over
    /// them where they lie. The caller has checked that they exist.
    pub fn put_region(
        &mut self,
        mem: &dyn Memory,
        region: RegionId,
        offset: usize,
        len: usize,
    ) -> Result<(), MissingRegion> {
        let all = mem
            .region(region)
            .and_then(|r| r.get(offset..offset.checked_add(len)?))
            .ok_or(MissingRegion(region))?;
        let mut done = 0;
        while done < len {
            let n = self.room().min(len - done);
            self.crc.update(&all[done..done + n]);
            self.q.push_region(region, offset + done, n);
            self.framer.pos += n as u64;
            done += n;
        }
        self.written += len;
        Ok(())
    }

    /// Writes pad and CRC (RFC 5044 §4.1: "The pad data MUST be set to zero
    /// by the sender"; §4.1: with CRCs off the field "is still present").
    pub fn finish(mut self) {
        debug_assert_eq!(self.written, HEADER_LEN + usize::from(self.ulpdu_len));
        let pad = fpdu::pad_len(usize::from(self.ulpdu_len));
        self.put_bytes_inner(&[0u8; 3][..pad], true);
        // A marker due right before the CRC field is covered by it (RFC
        // 5044 §4.4): write it before taking the value.
        self.room();
        let value = if self.framer.crc {
            self.crc.finish()
        } else {
            0
        };
        let wire: [u8; CRC_LEN] = crc::to_wire(value);
        self.put_bytes_inner(&wire, false);
        debug_assert!(self.framer.pos - self.header_pos < u64::from(u16::MAX) + 1024);
    }
}

/// Octets of an FPDU on the wire for stream position `pos`; used to check
/// the arithmetic above against the wire module in tests.
#[cfg(test)]
pub(crate) fn wire_len(pos: u64, ulpdu_len: usize, markers: bool) -> usize {
    fpdu::Layout::new(pos, ulpdu_len, markers)
        .map(|l| l.wire_len())
        .unwrap_or(0)
}

/// Which RDMAP message an [`OutMsg`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MsgKind {
    /// One of the four Sends (QN 0), with the Invalidate STag if any.
    Send { opcode: Opcode, msn: u32, inv: Stag },
    /// RDMA Read Request (QN 1).
    ReadRequest { msn: u32, rr: ReadRequestRepr },
    /// Terminate (QN 2).
    Terminate { msn: u32 },
    /// RDMA Write or Read Response: tagged.
    Tagged { opcode: Opcode, stag: Stag, to: u64 },
}

/// Where a message's payload comes from.
#[derive(Debug)]
pub(crate) enum Source {
    /// A work request's payload.
    Payload(Payload),
    /// The source range of an RDMA Read Response.
    Region { region: RegionId, offset: usize },
    /// Engine-made payload (the Terminate header; its length is the
    /// message's).
    Internal { bytes: [u8; 64] },
}

/// A message being segmented.
#[derive(Debug)]
pub(crate) struct OutMsg {
    pub kind: MsgKind,
    pub source: Source,
    pub len: u64,
    /// Payload octets already segmented.
    pub sent: u64,
    /// Reported when the last octet is written.
    pub mark: Option<Mark>,
    /// Gather cursor: current SGE and octets of it already used.
    sge: usize,
    sge_off: usize,
    /// The last segment has been written (a zero-length message has one).
    finished: bool,
}

/// A piece of a segment's payload.
enum Piece<'a> {
    Bytes(&'a [u8]),
    Region {
        region: RegionId,
        offset: usize,
        len: usize,
    },
}

impl OutMsg {
    pub fn new(kind: MsgKind, source: Source, len: u64, mark: Option<Mark>) -> OutMsg {
        OutMsg {
            kind,
            source,
            len,
            sent: 0,
            mark,
            sge: 0,
            sge_off: 0,
            finished: false,
        }
    }

    /// Whether every segment has been written.
    #[cfg(test)]
    pub fn done(&self) -> bool {
        self.finished
    }

    /// The lowest offset of `region` the payload not yet segmented refers
    /// to.
    pub fn region_low_water(&self, region: RegionId) -> Option<usize> {
        match &self.source {
            Source::Payload(Payload::Sges(s)) => {
                rebase::sges_low_water(s, (self.sge, self.sge_off), region)
            }
            Source::Region { region: r, offset } if *r == region && self.sent < self.len => {
                Some(offset.saturating_add(self.sent as usize))
            }
            _ => None,
        }
    }

    /// Points the payload not yet segmented at `rb.to` (see
    /// [`super::rebase`]). A Read Response's source is registered memory,
    /// which is never lent for one call: it is left alone.
    pub fn rebase(&mut self, rb: &Rebase<'_>) {
        if let Source::Payload(Payload::Sges(s)) = &mut self.source {
            if s.iter().any(|s| s.region == rb.from) {
                let mut cursor = (self.sge, self.sge_off);
                *s = rb.sges(s, &mut cursor);
                (self.sge, self.sge_off) = cursor;
            }
        }
    }

    fn header_len(&self) -> usize {
        match self.kind {
            MsgKind::Tagged { .. } => 14,
            MsgKind::ReadRequest { .. } => MAX_HEADER_LEN,
            _ => 18,
        }
    }

    /// Calls `f` with the pieces of payload `[sent, sent + n)` in order;
    /// without `commit`, leaves the cursor where it was.
    fn pieces(&mut self, n: usize, commit: bool, mut f: impl FnMut(Piece<'_>)) {
        match &self.source {
            Source::Payload(Payload::Inline(v)) => {
                let start = self.sent as usize;
                f(Piece::Bytes(&v[start..start + n]));
            }
            Source::Internal { bytes, .. } => {
                let start = self.sent as usize;
                f(Piece::Bytes(&bytes[start..start + n]));
            }
            Source::Region { region, offset } => f(Piece::Region {
                region: *region,
                offset: offset + self.sent as usize,
                len: n,
            }),
            Source::Payload(Payload::Sges(sges)) => {
                let (mut i, mut off, mut left) = (self.sge, self.sge_off, n);
                while left > 0 {
                    let Some(&Sge {
                        region,
                        offset,
                        len,
                    }) = sges.get(i)
                    else {
                        break;
                    };
                    let take = (len - off).min(left);
                    if take > 0 {
                        f(Piece::Region {
                            region,
                            offset: offset + off,
                            len: take,
                        });
                    }
                    left -= take;
                    off += take;
                    if off == len {
                        i += 1;
                        off = 0;
                    }
                }
                if commit {
                    self.sge = i;
                    self.sge_off = off;
                }
            }
        }
    }

    /// Segments and frames the next DDP segment of at most `mulpdu` octets
    /// into `q`. Returns whether that was the last.
    pub fn write_segment(
        &mut self,
        framer: &mut Framer,
        q: &mut TxQueue,
        mem: &dyn Memory,
        mulpdu: usize,
    ) -> Result<bool, MissingRegion> {
        let hlen = self.header_len();
        // RFC 5041 §5.2: each segment "MUST be no larger than the MULPDU".
        let room = mulpdu.saturating_sub(hlen).max(1) as u64;
        let n = (self.len - self.sent).min(room) as usize;
        let last = self.sent + n as u64 == self.len;
        // Check the memory before writing a byte, so that a failure leaves
        // no partial FPDU behind.
        let mut missing = None;
        self.pieces(n, false, |p| {
            if let Piece::Region {
                region,
                offset,
                len,
            } = p
            {
                let ok = mem
                    .region(region)
                    .and_then(|r| r.get(offset..offset.checked_add(len)?))
                    .is_some();
                if !ok && missing.is_none() {
                    missing = Some(MissingRegion(region));
                }
            }
        });
        if let Some(m) = missing {
            return Err(m);
        }

        let mut header = [0u8; MAX_HEADER_LEN];
        let mo = self.sent as u32;
        let repr = match self.kind {
            MsgKind::Send { opcode, msn, inv } => RdmapRepr {
                opcode,
                last,
                model: BufferModel::Untagged {
                    qn: QueueNumber::SEND,
                    msn,
                    mo,
                    rsvd_ulp32: inv.0,
                },
                read_request: None,
            },
            MsgKind::ReadRequest { msn, rr } => RdmapRepr {
                opcode: Opcode::RDMA_READ_REQUEST,
                last,
                model: BufferModel::Untagged {
                    qn: QueueNumber::READ_REQUEST,
                    msn,
                    mo,
                    rsvd_ulp32: 0,
                },
                read_request: Some(rr),
            },
            MsgKind::Terminate { msn } => RdmapRepr {
                opcode: Opcode::TERMINATE,
                last,
                model: BufferModel::Untagged {
                    qn: QueueNumber::TERMINATE,
                    msn,
                    mo,
                    rsvd_ulp32: 0,
                },
                read_request: None,
            },
            MsgKind::Tagged { opcode, stag, to } => RdmapRepr {
                opcode,
                last,
                // RFC 5041 §5.2: the TO of each segment is the initial TO
                // plus the offset of its first octet (no wrap: checked when
                // the work was posted).
                model: BufferModel::Tagged {
                    stag,
                    to: to.wrapping_add(self.sent),
                },
                read_request: None,
            },
        };
        debug_assert_eq!(repr.buffer_len(), hlen);
        repr.emit(&mut header[..hlen]);

        // hlen + n <= max(mulpdu, hlen + 1) <= 65535.
        let ulpdu_len = (hlen + n) as u16;
        let mut w = framer.begin(q, ulpdu_len);
        w.put_bytes(&header[..hlen]);
        let mut result = Ok(());
        self.pieces(n, true, |p| match p {
            Piece::Bytes(b) => w.put_bytes(b),
            Piece::Region {
                region,
                offset,
                len,
            } => {
                if let Err(e) = w.put_region(mem, region, offset, len) {
                    result = Err(e);
                }
            }
        });
        result?;
        w.finish();
        self.sent += n as u64;
        if last {
            self.finished = true;
            if let Some(mark) = self.mark {
                q.push_mark(mark);
            }
        }
        Ok(last)
    }
}

/// Stream octets per marker interval, for tests.
#[cfg(test)]
pub(crate) const INTERVAL: u64 = fpdu::MARKER_INTERVAL;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;
    use crate::wire::fpdu::{FpduRepr, Framing, Ulpdu};

    fn drain(q: &mut TxQueue, mem: &VecMemory) -> Vec<u8> {
        let mut v = Vec::new();
        q.for_each_slice(mem, |s| {
            v.extend_from_slice(s);
            true
        })
        .unwrap();
        q.advance(v.len());
        v
    }

    /// The writer's output equals the wire module's FPDU at every alignment.
    #[test]
    fn writer_matches_wire_module() {
        let mut mem = VecMemory::new();
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 13 + 5) as u8).collect();
        let region = mem.add(data.clone());
        for markers in [false, true] {
            for crc in [false, true] {
                for pos in (0..2 * INTERVAL).step_by(4) {
                    for len in [14usize, 15, 16, 17, 18, 100, 509, 510, 1023, 2900] {
                        let mut framer = Framer { pos, markers, crc };
                        let mut q = TxQueue::new();
                        let mut w = framer.begin(&mut q, len as u16);
                        let split = len / 3;
                        w.put_bytes(&data[..split]);
                        w.put_region(&mem, region, split, len - split).unwrap();
                        w.finish();
                        let got = drain(&mut q, &mem);
                        let want = FpduRepr {
                            ulpdu: Ulpdu::new(&data[..len]),
                        }
                        .to_vec(pos, Framing { markers, crc })
                        .unwrap();
                        let diff = got.iter().zip(&want).position(|(a, b)| a != b);
                        assert!(
                            got == want,
                            "pos {pos} len {len} markers {markers} diff {diff:?} tails {:?} {:?}",
                            &got[got.len().saturating_sub(12)..],
                            &want[want.len().saturating_sub(12)..]
                        );
                        assert_eq!(framer.pos, pos + wire_len(pos, len, markers) as u64);
                    }
                }
            }
        }
    }

    #[test]
    fn segments_a_send() {
        let mut mem = VecMemory::new();
        let region = mem.add((0..=255).collect());
        let mut msg = OutMsg::new(
            MsgKind::Send {
                opcode: Opcode::SEND,
                msn: 1,
                inv: Stag(0),
            },
            Source::Payload(Payload::Sges(vec![
                Sge {
                    region,
                    offset: 0,
                    len: 100,
                },
                Sge {
                    region,
                    offset: 200,
                    len: 50,
                },
            ])),
            150,
            Some(Mark::Message(9)),
        );
        let mut framer = Framer {
            pos: 0,
            markers: false,
            crc: true,
        };
        let mut q = TxQueue::new();
        // MULPDU 128: 110 payload octets per untagged segment.
        assert!(!msg.write_segment(&mut framer, &mut q, &mem, 128).unwrap());
        assert!(msg.write_segment(&mut framer, &mut q, &mem, 128).unwrap());
        assert!(msg.done());
        let wire = drain(&mut q, &mem);
        assert_eq!(q.pop_done_mark(), Some(Mark::Message(9)));
        let framing = Framing {
            markers: false,
            crc: true,
        };
        let (first, n) = fpdu::parse(&wire, 0, framing).unwrap();
        let (second, _) = fpdu::parse(&wire[n..], n as u64, framing).unwrap();
        let first = first.ulpdu.to_vec();
        let second = second.ulpdu.to_vec();
        assert_eq!(first.len(), 128);
        assert_eq!(&first[..2], &[0x01, 0x43]); // not last
        assert_eq!(&second[..2], &[0x41, 0x43]); // last
        assert_eq!(&second[14..18], &110u32.to_be_bytes()); // MO
        let mut payload = first[18..].to_vec();
        payload.extend_from_slice(&second[18..]);
        let want: Vec<u8> = (0..100).chain(200..250).collect();
        assert_eq!(payload, want);
    }

    #[test]
    fn missing_memory_writes_nothing() {
        let mem = VecMemory::new();
        let mut msg = OutMsg::new(
            MsgKind::Tagged {
                opcode: Opcode::RDMA_WRITE,
                stag: Stag(0x100),
                to: 0,
            },
            Source::Region {
                region: RegionId(4),
                offset: 0,
            },
            10,
            None,
        );
        let mut framer = Framer {
            pos: 0,
            markers: true,
            crc: true,
        };
        let mut q = TxQueue::new();
        assert_eq!(
            msg.write_segment(&mut framer, &mut q, &mem, 1000),
            Err(MissingRegion(RegionId(4)))
        );
        assert!(q.is_empty());
        assert_eq!(framer.pos, 0);
    }

    #[test]
    fn zero_length_message_is_one_segment() {
        let mem = VecMemory::new();
        let mut msg = OutMsg::new(
            MsgKind::Tagged {
                opcode: Opcode::RDMA_WRITE,
                stag: Stag(0x100),
                to: 0,
            },
            Source::Payload(Payload::Inline(Vec::new())),
            0,
            Some(Mark::Message(1)),
        );
        assert!(!msg.done());
        let mut framer = Framer {
            pos: 0,
            markers: false,
            crc: true,
        };
        let mut q = TxQueue::new();
        assert!(msg.write_segment(&mut framer, &mut q, &mem, 1000).unwrap());
        assert!(msg.done());
        assert_eq!(q.len(), 2 + 14 + 4);
    }
}
