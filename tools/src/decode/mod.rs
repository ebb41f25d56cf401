//! A decoder for debugging: reads a capture file and prints, per TCP
//! connection, the MPA Request/Reply, every RDMAP message, and the SDP
//! messages carried by Sends (BSDH and extended header).
//!
//! It follows each direction of each connection as a byte stream: the MPA
//! frame first (RFC 5044 §7.1), then FPDUs (§4) framed as the two frames
//! negotiated — markers in a direction when the receiver set M, CRC when
//! either side set C — then DDP segments reassembled into messages by MSN
//! and MO (RFC 5041 §5). Streams that do not begin with an MPA key are
//! ignored (plain TCP, e.g. after a fallback).

pub mod capture;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;

use iwarp::wire::ddp::{BufferModel, QueueNumber};
use iwarp::wire::fpdu::{self, Framing};
use iwarp::wire::mpa::{self, Frame, FrameKind, FrameRepr};
use iwarp::wire::rdmap::{Opcode, RdmapRepr};
use iwarp::wire::terminate::{TerminateHeader, TerminateRepr};

use sdp_core::wire::{Body, MessageRepr};

/// Decodes a pcap or pcapng file into one line per message.
///
/// ```no_run
/// let file = std::fs::read("trace.pcapng")?;
/// for line in sdp_tools::decode::decode(&file)? {
///     println!("{line}");
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn decode(file: &[u8]) -> Result<Vec<String>, capture::Error> {
    let mut decoder = Decoder::default();
    for segment in capture::segments(file)? {
        decoder.segment(&segment);
    }
    Ok(decoder.lines)
}

#[derive(Default)]
struct Decoder {
    /// Per direction, keyed by (source, destination).
    directions: HashMap<(SocketAddr, SocketAddr), Direction>,
    lines: Vec<String>,
}

#[derive(Default)]
struct Direction {
    /// The next stream sequence number expected, once known.
    next_seq: Option<u32>,
    /// Segments that arrived ahead of `next_seq`.
    ahead: BTreeMap<u32, Vec<u8>>,
    /// In-order bytes not decoded yet.
    pending: Vec<u8>,
    phase: Phase,
    /// The M and C bits this direction's sender put in its frame.
    sent_markers: bool,
    sent_crc: bool,
    /// Untagged messages being reassembled, by (QN, MSN).
    partial: HashMap<(u32, u32), Vec<u8>>,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for this direction's MPA Request or Reply.
    #[default]
    Frame,
    /// FPDUs, at this stream position (RFC 5044 §4.3).
    Fpdus { pos: u64 },
    /// Not MPA, or MPA was rejected or broke: nothing more to decode.
    Done,
}

impl Decoder {
    fn segment(&mut self, seg: &capture::Segment) {
        let key = (seg.src, seg.dst);
        let dir = self.directions.entry(key).or_default();
        if seg.syn {
            dir.next_seq = Some(seg.seq.wrapping_add(1));
            return;
        }
        let next = *dir.next_seq.get_or_insert(seg.seq);
        // Keep only bytes at or after `next`; park anything further ahead.
        let offset = seg.seq.wrapping_sub(next);
        if offset as i32 > 0 {
            dir.ahead.insert(seg.seq, seg.payload.clone());
        } else {
            let skip = next.wrapping_sub(seg.seq) as usize;
            if let Some(fresh) = seg.payload.get(skip..) {
                dir.pending.extend_from_slice(fresh);
                dir.next_seq = Some(next.wrapping_add(fresh.len() as u32));
            }
            while let Some(entry) = dir.ahead.first_entry() {
                let cur = dir.next_seq.unwrap_or(next);
                let gap = entry.key().wrapping_sub(cur) as i32;
                if gap > 0 {
                    break;
                }
                let payload = entry.remove();
                if let Some(fresh) = payload.get((-gap) as usize..) {
                    dir.pending.extend_from_slice(fresh);
                    dir.next_seq = Some(cur.wrapping_add(fresh.len() as u32));
                }
            }
        }
        let prefix = format!("{:.6} {} > {}", seg.time, seg.src, seg.dst);
        self.drain(key, &prefix);
    }

    /// Decodes what is pending in direction `key`.
    fn drain(&mut self, key: (SocketAddr, SocketAddr), prefix: &str) {
        loop {
            let peer = self
                .directions
                .get(&(key.1, key.0))
                .map(|p| (p.sent_markers, p.sent_crc, p.phase));
            let Some(dir) = self.directions.get_mut(&key) else {
                return;
            };
            match dir.phase {
                Phase::Done => {
                    dir.pending.clear();
                    return;
                }
                Phase::Frame => match frame(dir) {
                    Step::Need => return,
                    Step::Line(line, next) => {
                        dir.phase = next;
                        self.lines.push(format!("{prefix} {line}"));
                    }
                },
                Phase::Fpdus { pos } => {
                    // The receiver's M bit decides markers in this direction.
                    let Some((peer_m, peer_c, peer_phase)) = peer else {
                        return;
                    };
                    if peer_phase == Phase::Frame {
                        return;
                    }
                    let framing = Framing {
                        markers: peer_m,
                        crc: peer_c || dir.sent_crc,
                    };
                    match fpdu::parse(&dir.pending, pos, framing) {
                        Err(fpdu::Error::Truncated) => return,
                        Err(e) => {
                            self.lines.push(format!("{prefix} FPDU error: {e}"));
                            dir.phase = Phase::Done;
                        }
                        Ok((repr, used)) => {
                            let ulpdu = repr.ulpdu.to_vec();
                            dir.pending.drain(..used);
                            dir.phase = Phase::Fpdus {
                                pos: pos + used as u64,
                            };
                            if let Some(line) = segment_line(dir, &ulpdu) {
                                self.lines.push(format!("{prefix} {line}"));
                            }
                        }
                    }
                }
            }
        }
    }
}

enum Step {
    Need,
    Line(String, Phase),
}

/// Reads this direction's MPA frame, if complete.
fn frame(dir: &mut Direction) -> Step {
    let header = match dir.pending.get(..mpa::HEADER_LEN) {
        Some(h) => h,
        None => {
            // Not MPA at all if what we have already differs from both keys.
            let n = dir.pending.len();
            let is_key_prefix = |key: &[u8]| key.starts_with(&dir.pending[..n.min(16)]);
            if n > 0 && !is_key_prefix(&mpa::REQUEST_KEY) && !is_key_prefix(&mpa::REPLY_KEY) {
                return Step::Line("not MPA: ignored".into(), Phase::Done);
            }
            return Step::Need;
        }
    };
    let len = match Frame::<&[u8]>::frame_len(header) {
        Ok(len) => len,
        Err(e) => return Step::Line(format!("not MPA ({e}): ignored"), Phase::Done),
    };
    let Some(bytes) = dir.pending.get(..len) else {
        return Step::Need;
    };
    let parsed = Frame::new_checked(bytes)
        .and_then(|f| FrameRepr::parse(&f))
        .and_then(|r| r.split_private_data().map(|(e, ulp)| (r, e, ulp)));
    let (line, next) = match parsed {
        Err(e) => (format!("bad MPA frame: {e}"), Phase::Done),
        Ok((repr, enhanced, ulp)) => {
            dir.sent_markers = repr.markers;
            dir.sent_crc = repr.crc;
            let mut line = format!(
                "MPA {} rev {} M={} C={} R={} S={} PD {}",
                match repr.kind {
                    FrameKind::Request => "Request",
                    FrameKind::Reply => "Reply",
                },
                repr.rev,
                u8::from(repr.markers),
                u8::from(repr.crc),
                u8::from(repr.rejected),
                u8::from(repr.enhanced),
                repr.private_data.len()
            );
            if let Some(e) = enhanced {
                let _ = write!(
                    line,
                    " [A={} B={} C={} D={} IRD={} ORD={}]",
                    u8::from(e.peer_to_peer),
                    u8::from(e.rtr_send),
                    u8::from(e.rtr_write),
                    u8::from(e.rtr_read),
                    e.ird,
                    e.ord
                );
            }
            // SDP carries its Hello in the Request's private data (§8.1.1).
            if !ulp.is_empty() {
                match MessageRepr::parse(ulp) {
                    Ok(msg) => {
                        let _ = write!(line, ": SDP {}", sdp_line(&msg));
                    }
                    Err(_) => {
                        let _ = write!(line, ": {} bytes of ULP private data", ulp.len());
                    }
                }
            }
            let next = if repr.rejected {
                Phase::Done
            } else {
                Phase::Fpdus { pos: 0 }
            };
            (line, next)
        }
    };
    dir.pending.drain(..len.min(dir.pending.len()));
    Step::Line(line, next)
}

/// Describes one DDP segment; untagged segments are collected until their
/// message is complete.
fn segment_line(dir: &mut Direction, ulpdu: &[u8]) -> Option<String> {
    let (rdmap, offset) = match RdmapRepr::parse_bytes(ulpdu) {
        Ok(parsed) => parsed,
        Err(e) => return Some(format!("bad DDP/RDMAP header: {e}")),
    };
    let payload = ulpdu.get(offset..).unwrap_or(&[]);
    let op = rdmap.opcode;
    match rdmap.model {
        BufferModel::Tagged { stag, to } => Some(format!(
            "{op} STag {:#010x} TO {to:#x} len {}{}",
            stag.0,
            payload.len(),
            if rdmap.last { " L" } else { "" }
        )),
        BufferModel::Untagged { qn, msn, mo, .. } => {
            if let Some(rr) = rdmap.read_request {
                return Some(format!(
                    "{op} MSN {msn}: sink STag {:#010x} TO {:#x} size {} from STag {:#010x} TO {:#x}",
                    rr.sink_stag.0, rr.sink_to, rr.size, rr.src_stag.0, rr.src_to
                ));
            }
            let message = dir.partial.entry((qn.0, msn)).or_default();
            if message.len() != mo as usize {
                dir.partial.remove(&(qn.0, msn));
                return Some(format!("{op} MSN {msn}: MO {mo} out of order, dropped"));
            }
            message.extend_from_slice(payload);
            if !rdmap.last {
                return None;
            }
            let message = dir.partial.remove(&(qn.0, msn)).unwrap_or_default();
            let mut line = format!("{op} QN {} MSN {msn}", qn.0);
            if let Some(stag) = rdmap.invalidate_stag() {
                let _ = write!(line, " invalidate {:#010x}", stag.0);
            }
            if op == Opcode::TERMINATE && qn == QueueNumber::TERMINATE {
                match TerminateHeader::new_checked(&message[..])
                    .and_then(|h| TerminateRepr::parse(&h))
                {
                    Ok(term) => {
                        let _ = write!(line, ": {}", term.code);
                    }
                    Err(e) => {
                        let _ = write!(line, ": bad Terminate header: {e}");
                    }
                }
            } else if op.is_send() {
                if message.is_empty() {
                    line.push_str(": empty");
                } else {
                    match MessageRepr::parse(&message) {
                        Ok(msg) => {
                            let _ = write!(line, ": SDP {}", sdp_line(&msg));
                        }
                        Err(e) => {
                            let _ = write!(line, ": {} bytes, not SDP: {e}", message.len());
                        }
                    }
                }
            } else {
                let _ = write!(line, ": {} bytes", message.len());
            }
            Some(line)
        }
    }
}

/// One SDP message: MID, BSDH fields, extended header, payload size.
fn sdp_line(msg: &MessageRepr<'_>) -> String {
    let mut line = format!(
        "{} bufs={} mseq={} mseq_ack={} flags={}",
        msg.body.mid(),
        msg.bufs,
        msg.mseq,
        msg.mseq_ack,
        msg.flags
    );
    let _ = match &msg.body {
        Body::Hello(h) => write!(line, " {h:?}"),
        Body::HelloAck(h) => write!(line, " {h:?}"),
        Body::RdmaWrCompl(h) => write!(line, " {h:?}"),
        Body::RdmaRdCompl(h) => write!(line, " {h:?}"),
        Body::ModeChange(h) => write!(line, " {h:?}"),
        Body::ChRcvBuf(h) => write!(line, " {h:?}"),
        Body::ChRcvBufAck(h) => write!(line, " {h:?}"),
        Body::SuspComm(h) => write!(line, " {h:?}"),
        Body::SrcAvail { header, .. } => write!(line, " {header:?}"),
        Body::SinkAvail { header, .. } => write!(line, " {header:?}"),
        _ => Ok(()),
    };
    let payload = msg.body.payload();
    if !payload.is_empty() {
        let _ = write!(line, " payload {}", payload.len());
    }
    line
}
