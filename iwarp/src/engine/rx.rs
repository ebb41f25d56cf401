//! The receive half of MPA: a streaming FPDU deframer that takes the byte
//! stream cut anywhere (down to single octets), strips and checks markers
//! (RFC 5044 §4.3, §8 code 3), collects the ULPDU_Length (§6: it "MUST be
//! used to determine if the entire FPDU is present") and the DDP/RDMAP
//! headers, hands payload octets through for placement, and checks pad and
//! CRC (§4.4, §8 code 2).
//!
//! The deframer never decides where payload goes and never delivers: it
//! reports [`RxEvent::Header`] once the headers are in (the engine then
//! validates them and picks a destination *before* any payload octet is
//! placed) and [`RxEvent::End`] with the CRC and marker verdicts once the
//! whole FPDU is in. Only then may the engine act on the FPDU (RFC 5044 §6:
//! "An MPA receiver MUST first verify the FPDU before passing the ULPDU to
//! DDP").
//!
//! Payload takes the fast path: [`Deframer::payload_run`] says how many
//! octets in a row are payload (up to the next marker), and
//! [`Deframer::consume_payload`] runs the CRC over them wherever the
//! caller put them. All other octets go through
//! [`Deframer::consume_control`]. Work per FPDU is O(1) plus the CRC.

use crate::wire::crc::{self, Crc, CRC_LEN};
use crate::wire::ddp::QueueNumber;
use crate::wire::fpdu::{self, HEADER_LEN, MARKER_INTERVAL, MARKER_LEN, MIN_ULPDU_LEN};
use crate::wire::rdmap::{self, Opcode};

/// How many ULPDU octets at most are collected as "header": enough for an
/// untagged DDP header followed by the whole payload of a Read Request (28)
/// or the largest Terminate header (4 + 2 + 18 + 28 = 52).
pub(crate) const HDR_CAP: usize = 96;

/// Smallest FPDU prefix before any payload: ULPDU_Length plus the smallest
/// DDP header.
const MIN_PREFIX: usize = HEADER_LEN + MIN_ULPDU_LEN;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Length,
    Header,
    Payload,
    Pad,
    Crc,
}

/// What [`Deframer::consume_control`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RxEvent {
    /// The headers are in: [`Deframer::header`] and
    /// [`Deframer::ulpdu_len`]. The payload (if any) follows.
    Header,
    /// The FPDU is complete.
    End {
        /// CRC matches, or CRCs are off.
        crc_ok: bool,
        /// Every marker in the FPDU pointed at its ULPDU_Length field.
        markers_ok: bool,
    },
}

/// The receive state of one MPA half connection.
#[derive(Debug, Clone)]
pub(crate) struct Deframer {
    markers: bool,
    crc_on: bool,
    /// Stream position of the next octet (RFC 5044 §4.3).
    pos: u64,
    phase: Phase,
    /// Stream position of the current FPDU's ULPDU_Length field.
    header_pos: u64,
    len_buf: [u8; HEADER_LEN],
    len_have: usize,
    ulpdu_len: usize,
    hdr: [u8; HDR_CAP],
    hdr_have: usize,
    payload_left: usize,
    pad_left: usize,
    crc_buf: [u8; CRC_LEN],
    crc_have: usize,
    crc: Crc,
    marker_buf: [u8; MARKER_LEN],
    markers_ok: bool,
}

/// How many ULPDU octets count as header, given the first `hdr` octets.
/// Grows as more octets arrive, never beyond `ulpdu_len`.
fn header_need(hdr: &[u8], ulpdu_len: usize) -> usize {
    let need = match hdr.first() {
        None => 1,
        Some(control) if control & 0x80 != 0 => 14,
        Some(_) if hdr.len() < 18 => 18,
        Some(_) => {
            let qn = QueueNumber(u32::from_be_bytes([hdr[6], hdr[7], hdr[8], hdr[9]]));
            let opcode = rdmap::control_opcode(hdr[1]);
            // Read Requests and Terminates carry their payload to RDMAP
            // itself (RFC 5040 §4.4, §4.8): collect it with the header.
            let internal = qn == QueueNumber::READ_REQUEST
                || qn == QueueNumber::TERMINATE
                || opcode == Opcode::RDMA_READ_REQUEST
                || opcode == Opcode::TERMINATE;
            if internal {
                HDR_CAP
            } else {
                18
            }
        }
    };
    need.min(ulpdu_len)
}

impl Deframer {
    pub fn new(markers: bool, crc: bool) -> Deframer {
        Deframer {
            markers,
            crc_on: crc,
            pos: 0,
            phase: Phase::Length,
            header_pos: 0,
            len_buf: [0; HEADER_LEN],
            len_have: 0,
            ulpdu_len: 0,
            hdr: [0; HDR_CAP],
            hdr_have: 0,
            payload_left: 0,
            pad_left: 0,
            crc_buf: [0; CRC_LEN],
            crc_have: 0,
            crc: Crc::new(),
            marker_buf: [0; MARKER_LEN],
            markers_ok: true,
        }
    }

    /// Octets of the marker still to come at the current position (0 when
    /// not inside one). Every multiple of 512 in the stream holds one.
    fn in_marker(&self) -> usize {
        if !self.markers {
            return 0;
        }
        let into = (self.pos % MARKER_INTERVAL) as usize;
        MARKER_LEN.saturating_sub(into)
    }

    /// Octets until the next marker (`usize::MAX` without markers).
    fn to_marker(&self) -> usize {
        if self.markers {
            fpdu::bytes_to_marker(self.pos)
        } else {
            usize::MAX
        }
    }

    /// ULPDU_Length of the current FPDU (valid from [`RxEvent::Header`]).
    pub fn ulpdu_len(&self) -> usize {
        self.ulpdu_len
    }

    /// The header octets collected (valid from [`RxEvent::Header`]).
    pub fn header(&self) -> &[u8] {
        &self.hdr[..self.hdr_have]
    }

    /// Payload octets of this FPDU still to come.
    pub fn payload_left(&self) -> usize {
        if self.phase == Phase::Payload {
            self.payload_left
        } else {
            0
        }
    }

    /// Payload octets that come next in a row (no marker in between); 0
    /// when the next octet is not payload.
    pub fn payload_run(&self) -> usize {
        if self.phase != Phase::Payload || self.in_marker() > 0 {
            return 0;
        }
        self.payload_left.min(self.to_marker())
    }

    /// How many octets a driver may read into a scratch buffer (and feed to
    /// [`Deframer::consume_control`] and the payload path) without reading
    /// past the start of placeable payload: conservative, at least 1.
    pub fn scratch_max(&self) -> usize {
        let marker = self.in_marker();
        let rest = match self.phase {
            Phase::Length => HEADER_LEN - self.len_have + MIN_ULPDU_LEN,
            Phase::Header => {
                header_need(self.header(), self.ulpdu_len).saturating_sub(self.hdr_have)
            }
            Phase::Payload => 0,
            Phase::Pad => self.pad_left + CRC_LEN + MIN_PREFIX,
            Phase::Crc => CRC_LEN - self.crc_have + MIN_PREFIX,
        };
        (marker + rest).max(1)
    }

    /// Runs the CRC over payload octets (at most [`Deframer::payload_run`])
    /// wherever the caller placed them.
    pub fn consume_payload(&mut self, data: &[u8]) {
        debug_assert!(data.len() <= self.payload_run());
        self.crc.update(data);
        self.pos += data.len() as u64;
        self.payload_left -= data.len();
        if self.payload_left == 0 {
            self.after_payload();
        }
    }

    fn after_payload(&mut self) {
        self.pad_left = fpdu::pad_len(self.ulpdu_len);
        self.phase = if self.pad_left > 0 {
            Phase::Pad
        } else {
            Phase::Crc
        };
    }

    /// Consumes octets that are not placeable payload (markers, length,
    /// headers, pad, CRC) from the front of `data`, stopping at an event,
    /// at placeable payload, or when `data` runs out. Returns the octets
    /// consumed.
    pub fn consume_control(&mut self, data: &[u8]) -> (usize, Option<RxEvent>) {
        let mut used = 0;
        while used < data.len() {
            let rest = &data[used..];
            let marker = self.in_marker();
            if marker > 0 {
                let n = marker.min(rest.len());
                let into = MARKER_LEN - marker;
                self.marker_buf[into..into + n].copy_from_slice(&rest[..n]);
                // RFC 5044 §4.4: the CRC covers markers.
                self.crc.update(&rest[..n]);
                self.pos += n as u64;
                used += n;
                if n == marker {
                    self.check_marker();
                }
                continue;
            }
            let room = self.to_marker().min(rest.len());
            match self.phase {
                Phase::Length => {
                    if self.len_have == 0 {
                        self.header_pos = self.pos;
                    }
                    let n = (HEADER_LEN - self.len_have).min(room);
                    self.len_buf[self.len_have..self.len_have + n].copy_from_slice(&rest[..n]);
                    self.crc.update(&rest[..n]);
                    self.len_have += n;
                    self.pos += n as u64;
                    used += n;
                    if self.len_have == HEADER_LEN {
                        self.ulpdu_len = usize::from(u16::from_be_bytes(self.len_buf));
                        self.hdr_have = 0;
                        self.phase = Phase::Header;
                        if let Some(ev) = self.header_progress() {
                            return (used, Some(ev));
                        }
                    }
                }
                Phase::Header => {
                    let need = header_need(self.header(), self.ulpdu_len);
                    let n = (need - self.hdr_have).min(room);
                    self.hdr[self.hdr_have..self.hdr_have + n].copy_from_slice(&rest[..n]);
                    self.crc.update(&rest[..n]);
                    self.hdr_have += n;
                    self.pos += n as u64;
                    used += n;
                    if let Some(ev) = self.header_progress() {
                        return (used, Some(ev));
                    }
                }
                Phase::Payload => {
                    // Placeable payload: the caller's job.
                    return (used, None);
                }
                Phase::Pad => {
                    let n = self.pad_left.min(room);
                    self.crc.update(&rest[..n]);
                    self.pad_left -= n;
                    self.pos += n as u64;
                    used += n;
                    if self.pad_left == 0 {
                        self.phase = Phase::Crc;
                    }
                }
                Phase::Crc => {
                    let n = (CRC_LEN - self.crc_have).min(room);
                    self.crc_buf[self.crc_have..self.crc_have + n].copy_from_slice(&rest[..n]);
                    self.crc_have += n;
                    self.pos += n as u64;
                    used += n;
                    if self.crc_have == CRC_LEN {
                        return (used, Some(self.end()));
                    }
                }
            }
        }
        (used, None)
    }

    /// After header octets arrived: if the header is complete, moves to
    /// the payload and reports it.
    fn header_progress(&mut self) -> Option<RxEvent> {
        if header_need(self.header(), self.ulpdu_len) > self.hdr_have {
            return None;
        }
        self.payload_left = self.ulpdu_len - self.hdr_have;
        self.phase = Phase::Payload;
        if self.payload_left == 0 {
            self.after_payload();
        }
        Some(RxEvent::Header)
    }

    fn check_marker(&mut self) {
        let got = u16::from_be_bytes([self.marker_buf[2], self.marker_buf[3]]);
        // RFC 5044 §4.3: FPDUPTR is the distance from the ULPDU_Length
        // field back to the marker; a marker right before the field holds
        // 0. The position of the marker is pos - 4.
        let marker_pos = self.pos - MARKER_LEN as u64;
        let want = if self.phase == Phase::Length && self.len_have == 0 {
            0
        } else {
            marker_pos.saturating_sub(self.header_pos) as u16
        };
        // RFC 5044 §4.2: the low two bits "MUST always treat these as zero
        // for calculations".
        if got & !3 != want {
            self.markers_ok = false;
        }
    }

    fn end(&mut self) -> RxEvent {
        // RFC 5044 §4.1: "When CRCs are not enabled, this field ... MUST NOT
        // be checked."
        let crc_ok = !self.crc_on || crc::from_wire(self.crc_buf) == self.crc.finish();
        let ev = RxEvent::End {
            crc_ok,
            markers_ok: self.markers_ok,
        };
        self.phase = Phase::Length;
        self.len_have = 0;
        self.hdr_have = 0;
        self.crc_have = 0;
        self.crc = Crc::new();
        self.markers_ok = true;
        ev
    }

    /// Whether the stream is between FPDUs (nothing of one received).
    pub fn at_boundary(&self) -> bool {
        self.phase == Phase::Length && self.len_have == 0 && self.in_marker() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::fpdu::{FpduRepr, Framing, Ulpdu};

    /// Feeds `wire` in chunks of `step`, collecting payload via the fast
    /// path; returns (headers, payloads, verdicts).
    fn run(d: &mut Deframer, wire: &[u8], step: usize) -> Vec<(Vec<u8>, Vec<u8>, bool, bool)> {
        let mut out = Vec::new();
        let mut cur = (Vec::new(), Vec::new());
        for chunk in wire.chunks(step) {
            let mut data = chunk;
            while !data.is_empty() {
                let run = d.payload_run();
                if run > 0 {
                    let n = run.min(data.len());
                    cur.1.extend_from_slice(&data[..n]);
                    d.consume_payload(&data[..n]);
                    data = &data[n..];
                    continue;
                }
                let (n, ev) = d.consume_control(data);
                data = &data[n..];
                match ev {
                    Some(RxEvent::Header) => cur.0 = d.header().to_vec(),
                    Some(RxEvent::End { crc_ok, markers_ok }) => {
                        let (h, p) = core::mem::take(&mut cur);
                        out.push((h, p, crc_ok, markers_ok));
                    }
                    None => assert!(n > 0 || d.payload_run() > 0),
                }
            }
        }
        out
    }

    fn send_ulpdu(payload: usize) -> Vec<u8> {
        let mut u = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        u.extend((0..payload).map(|i| (i * 31 + 7) as u8));
        u
    }

    #[test]
    fn deframes_what_the_wire_module_frames() {
        for markers in [false, true] {
            for crc in [false, true] {
                let framing = Framing { markers, crc };
                let mut wire = Vec::new();
                let mut ulpdus = Vec::new();
                for payload in [0usize, 1, 2, 3, 500, 1000, 5, 2000] {
                    let u = send_ulpdu(payload);
                    let f = FpduRepr {
                        ulpdu: Ulpdu::new(&u),
                    }
                    .to_vec(wire.len() as u64, framing)
                    .unwrap();
                    wire.extend_from_slice(&f);
                    ulpdus.push(u);
                }
                for step in [1, 2, 3, 7, 64, 511, 100_000] {
                    let mut d = Deframer::new(markers, crc);
                    let got = run(&mut d, &wire, step);
                    assert_eq!(got.len(), ulpdus.len());
                    for ((h, p, c, m), u) in got.iter().zip(&ulpdus) {
                        assert!(*c && *m, "step {step} markers {markers}");
                        assert_eq!(h.len(), 18);
                        assert_eq!([&h[..], &p[..]].concat(), *u);
                    }
                    assert!(d.at_boundary());
                }
            }
        }
    }

    #[test]
    fn collects_read_request_payload_with_header() {
        let mut u = vec![0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0];
        u.extend([9u8; 28]);
        let framing = Framing {
            markers: true,
            crc: true,
        };
        let wire = FpduRepr {
            ulpdu: Ulpdu::new(&u),
        }
        .to_vec(0, framing)
        .unwrap();
        let mut d = Deframer::new(true, true);
        let got = run(&mut d, &wire, 1);
        assert_eq!(got, vec![(u, vec![], true, true)]);
    }

    #[test]
    fn flipped_bits_and_bad_markers() {
        let framing = Framing {
            markers: true,
            crc: true,
        };
        let u = send_ulpdu(600);
        let wire = FpduRepr {
            ulpdu: Ulpdu::new(&u),
        }
        .to_vec(0, framing)
        .unwrap();
        // Every octet but the length field (which changes the framing).
        for i in (0..wire.len()).filter(|i| !(4..6).contains(i)) {
            let mut bad = wire.clone();
            bad[i] ^= 0x10;
            let mut d = Deframer::new(true, true);
            let got = run(&mut d, &bad, 13);
            assert_eq!(got.len(), 1);
            assert!(!got[0].2, "flip at {i} undetected");
        }
        // A marker that disagrees, with a CRC made to match: code 3.
        let mut bad = wire.clone();
        bad[512 + 3] = 0x40;
        let crc_at = bad.len() - 4;
        let c = crc::checksum(&bad[..crc_at]);
        bad[crc_at..].copy_from_slice(&crc::to_wire(c));
        let mut d = Deframer::new(true, true);
        let got = run(&mut d, &bad, 5);
        assert_eq!((got[0].2, got[0].3), (true, false));
    }

    #[test]
    fn scratch_max_never_swallows_payload() {
        let framing = Framing {
            markers: false,
            crc: true,
        };
        let mut wire = Vec::new();
        for payload in [100usize, 3, 200] {
            let f = FpduRepr {
                ulpdu: Ulpdu::new(&send_ulpdu(payload)),
            }
            .to_vec(wire.len() as u64, framing)
            .unwrap();
            wire.extend_from_slice(&f);
        }
        let mut d = Deframer::new(false, true);
        let mut data = &wire[..];
        let mut payload_octets = 0;
        while !data.is_empty() {
            let run = d.payload_run();
            if run > 0 {
                let n = run.min(data.len());
                d.consume_payload(&data[..n]);
                payload_octets += n;
                data = &data[n..];
                continue;
            }
            let max = d.scratch_max().min(data.len());
            let mut chunk = &data[..max];
            while !chunk.is_empty() {
                // Within scratch_max, nothing is placeable payload unless
                // the FPDU's payload is short enough to be fully inside it
                // (the 3-octet one): that part goes through the fast path.
                if d.payload_run() > 0 {
                    let n = d.payload_run().min(chunk.len());
                    d.consume_payload(&chunk[..n]);
                    payload_octets += n;
                    chunk = &chunk[n..];
                    continue;
                }
                let (n, _) = d.consume_control(chunk);
                chunk = &chunk[n..];
            }
            data = &data[max..];
        }
        assert_eq!(payload_octets, 303);
    }
}
