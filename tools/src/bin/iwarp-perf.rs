//! `iwarp-perf`: a perftest-like throughput and latency tool for the
//! iWARP stack over kernel TCP, which checks every byte it moves.
//!
//! ```text
//! iwarp-perf server [--port N] [--bind ADDR] [--once]
//! iwarp-perf client HOST[:PORT] --op send|write|read --size BYTES [--iters N]
//!            [--depth N] [--markers] [--no-crc] [--mpa-rev 1|2] [--mss N]
//!            [--aligned] [--verify full|stamps] [--seed N] [--timeout SECS]
//! ```
//!
//! The server serves clients concurrently, one thread each (`--once`: one
//! client, then exit). The client prints one table row — message size,
//! iterations, throughput in Gbit/s and MB/s (10^6 octets), per-iteration
//! round trip (average, p50, p99) — and the outcome of the data check. The
//! exit status is non-zero on any mismatch or error.
//!
//! * `--depth N`: iterations in flight at once, each with its own buffer
//!   on both sides (depth × size is capped at 256 MiB). Depth 1 gives the
//!   plain ping-pong latency; more keeps the pipe full. The default keeps
//!   about 2 MiB of buffers per side and at least two messages in flight
//!   (16 for 64 KiB, 8 for 256 KiB, 2 from 1 MiB): little enough to stay in
//!   cache, like a tool that sends from one buffer, without a pause for
//!   every Ack.
//! * `--markers`: both ends ask for MPA markers, so both directions carry
//!   them. `--no-crc`: neither end asks for CRCs (RFC 5044 §7.1.1: CRCs are
//!   used if either end asks). `--mpa-rev 1`: a plain RFC 5044 Request.
//! * `--mss N`: TCP_MAXSEG N before connecting, hence EMSS ≤ N and smaller
//!   FPDUs. `--aligned`: both ends write one FPDU per system call, each
//!   once TCP has sent everything before it, so every FPDU starts a TCP
//!   segment; for captures (docs/wire.md).
//! * `--verify stamps`: instead of every octet, only an 8-octet stamp per
//!   4 KiB page changes per iteration and is checked (the rest of each
//!   buffer holds a fixed pattern written once). It catches lost, stale,
//!   misplaced and reordered pages while touching 1/512 of the data, so
//!   that throughput compares with tools that do not look at the data
//!   (iperf3); with CRCs on, the CRC covers every octet on the wire.
//!
//! # Protocol
//!
//! All multi-octet fields are big-endian.
//!
//! **MPA Request Private Data** (client → server, 32 octets):
//!
//! | octets | field |
//! |---|---|
//! | 0..4 | magic `IWPF` |
//! | 4 | version, 1 |
//! | 5 | operation: 1 Send, 2 RDMA Write, 3 RDMA Read |
//! | 6 | flags: 0x01 markers, 0x02 no CRC, 0x04 aligned, 0x08 stamps |
//! | 7 | reserved, 0 |
//! | 8..16 | message size in octets (< 2^32) |
//! | 16..20 | iterations |
//! | 20..24 | depth: buffers per side, iterations in flight |
//! | 24..32 | seed of the data pattern |
//!
//! The server mirrors the framing flags in its own M and C bits and then
//! accepts with **Reply Private Data** (20 octets): magic, version, status
//! 0, two reserved octets, the STag (4 octets) and the Tagged Offset of
//! buffer 0 (8 octets) of its buffers — buffer `k` starts at TO + k × size
//! — registered for remote write (Write) or remote read (Read); 0 and 0 for
//! Send. It rejects (R=1) a request it cannot serve, with the magic,
//! version, a status (1 malformed, 2 too large) and a reason in ASCII.
//!
//! **Data.** Iteration `i` uses buffer `i mod depth` on both sides; its
//! payload is the pattern of (seed, `i`): a 64 KiB random block derived
//! from the seed, each 64 KiB of the message XORed with a word derived from
//! (seed, `i`, block number), so that stale, misplaced or shifted data
//! never passes. With the stamps flag, the buffers hold the pattern of a
//! fixed iteration and the first 8 octets of each 4 KiB page are replaced
//! by a stamp derived from (seed, `i`, page number).
//!
//! * Send: the server posts `depth` receive buffers of `size` octets; the
//!   client Sends iteration `i` from its buffer; the server checks the
//!   receive (length and pattern), reposts the buffer and answers Ack.
//! * Write: the client RDMA Writes iteration `i` into the server's buffer
//!   and then Sends Done(`i`); the Send is delivered after the Write is
//!   placed (RFC 5040 §5.5), so the server checks the buffer on Done and
//!   answers Ack.
//! * Read: the server fills its first `depth` buffers with the patterns of
//!   iterations 0…depth−1 before the Reply. The client RDMA Reads iteration
//!   `i`, checks it on completion, and Sends Done(`i`); the server refills
//!   that buffer with iteration `i + depth` and answers Ack.
//!
//! The client has at most `depth` iterations without an Ack. **Control
//! messages** are Sends of 16 octets: kind (4 octets: 1 Done, 2 Ack,
//! 3 Report), iteration (4), value (8: for Ack 0 = data good, 1 = bad).
//! After the last Ack the server Sends a **Report** (kind 3) whose
//! iteration field is the number of iterations it handled and whose value
//! is the number that failed its check; the client prints it and closes
//! the connection.
//!
//! The round trip of an iteration is from posting it to its Ack (Send,
//! Write) or to its Read completion (Read). Throughput is size × iterations
//! over the time from the first post to the last such event.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use iwarp::driver::{self, ConnectRequest, Endpoint, Options, Rejected};
use iwarp::engine::{
    Completion, ConnectionConfig, Payload, ReadWr, RecvWr, SendKind, SendWr, Sge, WcOpcode, WriteWr,
};
use iwarp::mem::{Access, Memory, RegionId, VecMemory};
use iwarp::wire::ddp::Stag;

/// Not claimed by a Wireshark dissector (docs/wire.md); perftest's port.
const DEFAULT_PORT: u16 = 18515;
const MAGIC: &[u8; 4] = b"IWPF";
const VERSION: u8 = 1;
const REQUEST_LEN: usize = 32;
const REPLY_LEN: usize = 20;
const CTRL_LEN: usize = 16;
/// Largest buffer space per side: depth × size.
const MAX_BUFFERS: u64 = 256 << 20;

const F_MARKERS: u8 = 0x01;
const F_NO_CRC: u8 = 0x02;
const F_ALIGNED: u8 = 0x04;
const F_STAMPS: u8 = 0x08;

const REJECT_MALFORMED: u8 = 1;
const REJECT_TOO_LARGE: u8 = 2;

/// Work request ids: receives of control messages.
const WR_CTRL: u64 = 1 << 40;
/// Unsignaled control Sends.
const WR_SEND_CTRL: u64 = 1 << 41;
/// The Report.
const WR_REPORT: u64 = 1 << 42;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Send = 1,
    Write = 2,
    Read = 3,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        match v {
            1 => Some(Op::Send),
            2 => Some(Op::Write),
            3 => Some(Op::Read),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::Send => "send",
            Op::Write => "write",
            Op::Read => "read",
        }
    }
}

/// The client's Request Private Data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Request {
    op: Op,
    flags: u8,
    size: u64,
    iters: u32,
    depth: u32,
    seed: u64,
}

impl Request {
    fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[6] = self.flags;
        b[8..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.iters.to_be_bytes());
        b[20..24].copy_from_slice(&self.depth.to_be_bytes());
        b[24..32].copy_from_slice(&self.seed.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Request, String> {
        if b.len() < REQUEST_LEN || &b[0..4] != MAGIC || b[4] != VERSION {
            return Err("not an iwarp-perf version 1 request".into());
        }
        let op = Op::from_u8(b[5]).ok_or_else(|| format!("unknown operation {}", b[5]))?;
        let word = |r: core::ops::Range<usize>| {
            b[r].iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
        };
        let size = word(8..16);
        let req = Request {
            op,
            flags: b[6],
            size,
            iters: word(16..20) as u32,
            depth: word(20..24) as u32,
            seed: word(24..32),
        };
        if size > u64::from(u32::MAX) {
            return Err("message size of 2^32 octets or more".into());
        }
        if req.depth == 0 {
            return Err("depth 0".into());
        }
        Ok(req)
    }
}

/// Buffers per side for `size` octets and the requested depth.
fn effective_depth(size: u64, depth: u32, iters: u32) -> u32 {
    let fit = (MAX_BUFFERS / size.max(1)).max(1);
    depth
        .min(iters.max(1))
        .min(fit.min(u64::from(u32::MAX)) as u32)
        .max(1)
}

fn reject_pd(status: u8, why: &str) -> Vec<u8> {
    let mut v = MAGIC.to_vec();
    v.push(VERSION);
    v.push(status);
    v.extend_from_slice(&why.as_bytes()[..why.len().min(200)]);
    v
}

/// The server's Reply Private Data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reply {
    stag: Stag,
    base_to: u64,
}

impl Reply {
    fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4] = VERSION;
        b[8..12].copy_from_slice(&self.stag.0.to_be_bytes());
        b[12..20].copy_from_slice(&self.base_to.to_be_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Reply, String> {
        if b.len() < REPLY_LEN || &b[0..4] != MAGIC || b[4] != VERSION || b[5] != 0 {
            return Err("not an iwarp-perf version 1 reply".into());
        }
        let mut stag = [0u8; 4];
        stag.copy_from_slice(&b[8..12]);
        let mut to = [0u8; 8];
        to.copy_from_slice(&b[12..20]);
        Ok(Reply {
            stag: Stag(u32::from_be_bytes(stag)),
            base_to: u64::from_be_bytes(to),
        })
    }
}

/// A control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctrl {
    Done { iter: u32 },
    Ack { iter: u32, ok: bool },
    Report { handled: u32, bad: u64 },
}

impl Ctrl {
    fn encode(&self) -> Vec<u8> {
        let (kind, iter, value) = match *self {
            Ctrl::Done { iter } => (1u32, iter, 0u64),
            Ctrl::Ack { iter, ok } => (2, iter, u64::from(!ok)),
            Ctrl::Report { handled, bad } => (3, handled, bad),
        };
        let mut v = Vec::with_capacity(CTRL_LEN);
        v.extend_from_slice(&kind.to_be_bytes());
        v.extend_from_slice(&iter.to_be_bytes());
        v.extend_from_slice(&value.to_be_bytes());
        v
    }

    fn decode(b: &[u8]) -> Result<Ctrl, String> {
        if b.len() != CTRL_LEN {
            return Err(format!("control message of {} octets", b.len()));
        }
        let mut w4 = [0u8; 4];
        w4.copy_from_slice(&b[0..4]);
        let kind = u32::from_be_bytes(w4);
        w4.copy_from_slice(&b[4..8]);
        let iter = u32::from_be_bytes(w4);
        let mut w8 = [0u8; 8];
        w8.copy_from_slice(&b[8..16]);
        let value = u64::from_be_bytes(w8);
        match kind {
            1 => Ok(Ctrl::Done { iter }),
            2 => Ok(Ctrl::Ack {
                iter,
                ok: value == 0,
            }),
            3 => Ok(Ctrl::Report {
                handled: iter,
                bad: value,
            }),
            k => Err(format!("unknown control message kind {k}")),
        }
    }
}

fn ctrl_send(wr_id: u64, c: Ctrl, signaled: bool) -> SendWr {
    SendWr {
        wr_id,
        kind: SendKind::Send,
        payload: Payload::Inline(c.encode()),
        signaled,
    }
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Octets of the pattern's random block.
const BLOCK: usize = 64 * 1024;

/// Octets between stamps (`--verify stamps`).
const PAGE: usize = 4096;

/// The data pattern (see the module docs).
struct Pattern {
    seed: u64,
    block: Vec<u64>,
    /// Only a stamp per page changes per iteration, and only stamps are
    /// checked.
    stamps: bool,
}

impl Pattern {
    fn new(seed: u64, stamps: bool) -> Pattern {
        let block = (0..BLOCK / 8)
            .map(|i| splitmix(seed ^ splitmix(i as u64)))
            .collect();
        Pattern {
            seed,
            block,
            stamps,
        }
    }

    /// Once per buffer, before its first use by the sender: with stamps,
    /// the part of the pattern that no iteration changes.
    fn prepare(&self, out: &mut [u8]) {
        if self.stamps {
            self.fill_full(u32::MAX, out);
        }
    }

    fn stamp(&self, iter: u32, page: usize) -> [u8; 8] {
        self.key(iter, page ^ (1 << 40)).to_le_bytes()
    }

    /// Writes iteration `iter`'s payload into `out` (with stamps: its
    /// stamps into a prepared buffer).
    fn fill(&self, iter: u32, out: &mut [u8]) {
        if !self.stamps {
            return self.fill_full(iter, out);
        }
        for (p, page) in out.chunks_mut(PAGE).enumerate() {
            let n = page.len().min(8);
            page[..n].copy_from_slice(&self.stamp(iter, p)[..n]);
        }
    }

    /// Whether `buf` holds iteration `iter`'s payload (with stamps: its
    /// stamps); else the offset of the first wrong octet.
    fn check(&self, iter: u32, buf: &[u8]) -> Result<(), usize> {
        if !self.stamps {
            return self.check_full(iter, buf);
        }
        for (p, page) in buf.chunks(PAGE).enumerate() {
            let n = page.len().min(8);
            let want = self.stamp(iter, p);
            if let Some(i) = page[..n].iter().zip(&want).position(|(a, b)| a != b) {
                return Err(p * PAGE + i);
            }
        }
        Ok(())
    }

    fn key(&self, iter: u32, block: usize) -> u64 {
        splitmix(self.seed ^ (u64::from(iter) << 32) ^ splitmix(block as u64))
    }

    fn fill_full(&self, iter: u32, out: &mut [u8]) {
        for (b, chunk) in out.chunks_mut(BLOCK).enumerate() {
            let k = self.key(iter, b);
            let full = chunk.len() / 8;
            let mut words = chunk.chunks_exact_mut(8);
            for (dst, w) in (&mut words).zip(&self.block) {
                dst.copy_from_slice(&(w ^ k).to_le_bytes());
            }
            let tail = words.into_remainder();
            let last = self.block[full % self.block.len()] ^ k;
            let n = tail.len();
            tail.copy_from_slice(&last.to_le_bytes()[..n]);
        }
    }

    fn check_full(&self, iter: u32, buf: &[u8]) -> Result<(), usize> {
        for (b, chunk) in buf.chunks(BLOCK).enumerate() {
            let k = self.key(iter, b);
            let mut words = chunk.chunks_exact(8);
            let diff = (&mut words).zip(&self.block).fold(0u64, |acc, (src, w)| {
                let mut a = [0u8; 8];
                a.copy_from_slice(src);
                acc | (u64::from_le_bytes(a) ^ w ^ k)
            });
            let tail = words.remainder();
            let last = (self.block[(chunk.len() / 8) % self.block.len()] ^ k).to_le_bytes();
            if diff != 0 || tail != &last[..tail.len()] {
                let mut want = vec![0u8; chunk.len()];
                self.fill_block(iter, b, &mut want);
                let at = chunk
                    .iter()
                    .zip(&want)
                    .position(|(x, y)| x != y)
                    .unwrap_or(0);
                return Err(b * BLOCK + at);
            }
        }
        Ok(())
    }

    fn fill_block(&self, iter: u32, b: usize, out: &mut [u8]) {
        let k = self.key(iter, b);
        for (i, dst) in out.iter_mut().enumerate() {
            let w = self.block[(i / 8) % self.block.len()] ^ k;
            *dst = w.to_le_bytes()[i % 8];
        }
    }
}

/// The framing and connection settings both ends use.
fn config(flags: u8, rev: u8) -> ConnectionConfig {
    let mut cfg = ConnectionConfig::default();
    cfg.startup.markers = flags & F_MARKERS != 0;
    cfg.startup.crc = flags & F_NO_CRC == 0;
    if rev == 1 {
        cfg.startup = cfg.startup.rev1();
    }
    cfg
}

fn region_mut(mem: &mut VecMemory, r: RegionId) -> &mut [u8] {
    mem.region_mut(r).expect("own region")
}

fn region(mem: &VecMemory, r: RegionId) -> &[u8] {
    mem.region(r).expect("own region")
}

/// Drives `ep` until at least one completion, which it returns.
fn completions(
    ep: &mut Endpoint,
    mem: &mut VecMemory,
    timeout: Duration,
) -> io::Result<Vec<Completion>> {
    let mut got = Vec::new();
    ep.drive_until(mem, Some(Instant::now() + timeout), &mut |ep| {
        got.extend(std::iter::from_fn(|| {
            ep.connection_mut().datapath_mut().poll_completion()
        }));
        !got.is_empty()
    })?;
    Ok(got)
}

// ---- server -------------------------------------------------------------

/// One client's session on the server.
struct Session {
    req: Request,
    depth: u32,
    size: usize,
    bufs: RegionId,
    ctrl: RegionId,
    pattern: Pattern,
    handled: u32,
    bad: u64,
}

impl Session {
    /// Buffers, registration, receives; the Reply to send.
    fn new(
        req: Request,
        ep: &mut Endpoint,
        mem: &mut VecMemory,
    ) -> Result<(Session, Reply), Vec<u8>> {
        let depth = effective_depth(req.size, req.depth, req.iters);
        let size = req.size as usize;
        let total = size
            .checked_mul(depth as usize)
            .filter(|&t| t as u64 <= MAX_BUFFERS.max(req.size))
            .ok_or_else(|| reject_pd(REJECT_TOO_LARGE, "buffers too large"))?;
        let bufs = mem.add(vec![0; total]);
        let ctrl = mem.add(vec![0; depth as usize * CTRL_LEN]);
        let pattern = Pattern::new(req.seed, req.flags & F_STAMPS != 0);
        let conn = ep.connection_mut();
        let refuse = |e: &dyn std::fmt::Display| reject_pd(REJECT_MALFORMED, &e.to_string());
        let mut reply = Reply {
            stag: Stag(0),
            base_to: 0,
        };
        match req.op {
            Op::Send => {
                for k in 0..depth as usize {
                    let sge = Sge {
                        region: bufs,
                        offset: k * size,
                        len: size,
                    };
                    conn.datapath_mut()
                        .post_recv(RecvWr {
                            wr_id: k as u64,
                            sge,
                        })
                        .map_err(|e| refuse(&e))?;
                }
            }
            Op::Write | Op::Read => {
                let access = if req.op == Op::Write {
                    Access::REMOTE_WRITE
                } else {
                    Access::REMOTE_READ
                };
                reply.stag = conn
                    .datapath_mut()
                    .register(bufs, 0, total as u64, access)
                    .map_err(|e| refuse(&e))?;
                for k in 0..depth as usize {
                    let sge = Sge {
                        region: ctrl,
                        offset: k * CTRL_LEN,
                        len: CTRL_LEN,
                    };
                    conn.datapath_mut()
                        .post_recv(RecvWr {
                            wr_id: WR_CTRL + k as u64,
                            sge,
                        })
                        .map_err(|e| refuse(&e))?;
                }
                if req.op == Op::Read {
                    pattern.prepare(region_mut(mem, bufs));
                    for i in 0..depth.min(req.iters) {
                        let at = i as usize * size;
                        pattern.fill(i, &mut region_mut(mem, bufs)[at..at + size]);
                    }
                }
            }
        }
        let session = Session {
            req,
            depth,
            size,
            bufs,
            ctrl,
            pattern,
            handled: 0,
            bad: 0,
        };
        Ok((session, reply))
    }

    fn slot(&self, iter: u32) -> std::ops::Range<usize> {
        let at = (iter % self.depth) as usize * self.size;
        at..at + self.size
    }

    /// A receive completed: check, refill, repost, acknowledge.
    fn on_recv(
        &mut self,
        c: &Completion,
        ep: &mut Endpoint,
        mem: &mut VecMemory,
    ) -> Result<(), String> {
        let iter = self.handled;
        let conn = ep.connection_mut();
        let ok = match self.req.op {
            Op::Send => {
                let slot = self.slot(iter);
                let ok = c.byte_len as usize == self.size
                    && c.wr_id == u64::from(iter % self.depth)
                    && self
                        .pattern
                        .check(iter, &region(mem, self.bufs)[slot.clone()])
                        .is_ok();
                let sge = Sge {
                    region: self.bufs,
                    offset: slot.start,
                    len: self.size,
                };
                conn.datapath_mut()
                    .post_recv(RecvWr {
                        wr_id: c.wr_id,
                        sge,
                    })
                    .map_err(|e| e.to_string())?;
                ok
            }
            Op::Write | Op::Read => {
                let k = c.wr_id.wrapping_sub(WR_CTRL) as usize;
                let at = k * CTRL_LEN;
                let msg = Ctrl::decode(&region(mem, self.ctrl)[at..at + c.byte_len as usize])?;
                let Ctrl::Done { iter: done } = msg else {
                    return Err(format!("unexpected {msg:?}"));
                };
                if done != iter {
                    return Err(format!("Done for iteration {done}, expected {iter}"));
                }
                let slot = self.slot(iter);
                let ok = if self.req.op == Op::Write {
                    self.pattern
                        .check(iter, &region(mem, self.bufs)[slot])
                        .is_ok()
                } else {
                    let next = iter + self.depth;
                    if next < self.req.iters {
                        self.pattern
                            .fill(next, &mut region_mut(mem, self.bufs)[slot]);
                    }
                    true
                };
                let sge = Sge {
                    region: self.ctrl,
                    offset: at,
                    len: CTRL_LEN,
                };
                conn.datapath_mut()
                    .post_recv(RecvWr {
                        wr_id: c.wr_id,
                        sge,
                    })
                    .map_err(|e| e.to_string())?;
                ok
            }
        };
        self.handled += 1;
        self.bad += u64::from(!ok);
        conn.datapath_mut()
            .post_send(ctrl_send(WR_SEND_CTRL, Ctrl::Ack { iter, ok }, false))
            .map_err(|e| e.to_string())?;
        if self.handled == self.req.iters {
            let report = Ctrl::Report {
                handled: self.handled,
                bad: self.bad,
            };
            conn.datapath_mut()
                .post_send(ctrl_send(WR_REPORT, report, true))
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Serves one client: startup, iterations, Report, until the client
/// closes.
fn session(stream: TcpStream) -> Result<String, String> {
    let peer = stream.peer_addr().map_err(|e| e.to_string())?;
    let mut mem = VecMemory::new();
    let mut state = None;
    let mut ep = driver::respond(
        stream,
        ConnectionConfig::default(),
        &Options::default(),
        |ep, req: &ConnectRequest| {
            let r =
                Request::decode(&req.private_data).map_err(|e| reject_pd(REJECT_MALFORMED, &e))?;
            // Mirror the client's framing: markers both ways, or no CRC.
            ep.connection_mut()
                .set_framing(r.flags & F_MARKERS != 0, r.flags & F_NO_CRC == 0)
                .map_err(|e| reject_pd(REJECT_MALFORMED, &e.to_string()))?;
            if r.flags & F_ALIGNED != 0 {
                ep.set_aligned(true)
                    .map_err(|e| reject_pd(REJECT_MALFORMED, &e.to_string()))?;
            }
            let (s, reply) = Session::new(r, ep, &mut mem)?;
            state = Some(s);
            Ok(reply.encode().to_vec())
        },
    )
    .map_err(|e| format!("{peer}: {e}"))?;
    let Some(mut s) = state else {
        return Err(format!("{peer}: no session"));
    };
    let idle = Duration::from_secs(60);
    if s.req.iters == 0 {
        ep.connection_mut()
            .datapath_mut()
            .post_send(ctrl_send(
                WR_REPORT,
                Ctrl::Report { handled: 0, bad: 0 },
                true,
            ))
            .map_err(|e| e.to_string())?;
    }
    let mut reported = false;
    while !reported {
        let cs = completions(&mut ep, &mut mem, idle).map_err(|e| format!("{peer}: {e}"))?;
        for c in cs {
            if reported {
                // The client may close at once: the rest is flushed.
                break;
            }
            if !c.status.is_success() {
                return Err(format!("{peer}: work request failed: {c:?}"));
            }
            match c.opcode {
                WcOpcode::Recv => s.on_recv(&c, &mut ep, &mut mem)?,
                WcOpcode::Send if c.wr_id == WR_REPORT => reported = true,
                _ => {}
            }
        }
    }
    // The client closes once it has the Report.
    let _ = ep.drive_until(&mut mem, Some(Instant::now() + idle), &mut |ep| {
        ep.is_closed()
    });
    Ok(format!(
        "{peer}: {} {} B x {}: {} handled, {} bad",
        s.req.op.name(),
        s.req.size,
        s.req.iters,
        s.handled,
        s.bad
    ))
}

fn server(args: &[String]) -> Result<(), String> {
    let mut port = DEFAULT_PORT;
    let mut bind = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    let mut once = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--port" => port = value(&mut it, a)?,
            "--bind" => bind = value(&mut it, a)?,
            "--once" => once = true,
            other => return Err(format!("unknown server option {other}")),
        }
    }
    let listener = TcpListener::bind((bind, port)).map_err(|e| format!("bind: {e}"))?;
    println!(
        "iwarp-perf server listening on {}",
        listener.local_addr().map_err(|e| e.to_string())?
    );
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                eprintln!("accept: {e}");
                continue;
            }
        };
        let worker = thread::spawn(move || match session(stream) {
            Ok(line) => println!("{line}"),
            Err(e) => eprintln!("session: {e}"),
        });
        if once {
            let _ = worker.join();
            break;
        }
    }
    Ok(())
}

// ---- client -------------------------------------------------------------

struct ClientArgs {
    addr: String,
    op: Op,
    size: u64,
    iters: u32,
    depth: u32,
    flags: u8,
    rev: u8,
    mss: Option<u32>,
    seed: u64,
    timeout: Duration,
}

/// What a client run measured.
struct Outcome {
    elapsed: Duration,
    lat: Vec<Duration>,
    local_bad: u64,
    ack_bad: u64,
    handled: u32,
    server_bad: u64,
    mulpdu: usize,
    depth: u32,
}

fn run_client(a: &ClientArgs) -> Result<Outcome, String> {
    let depth = effective_depth(a.size, a.depth, a.iters);
    let req = Request {
        op: a.op,
        flags: a.flags,
        size: a.size,
        iters: a.iters,
        depth,
        seed: a.seed,
    };
    let opts = Options {
        mss: a.mss,
        aligned: a.flags & F_ALIGNED != 0,
    };
    let addr = if a.addr.contains(':') {
        a.addr.clone()
    } else {
        format!("{}:{DEFAULT_PORT}", a.addr)
    };
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("{addr}: {e}"))?
        .collect();
    let mut ep = driver::connect_with(&addrs[..], config(a.flags, a.rev), &req.encode(), &opts)
        .map_err(
            |e| match e.get_ref().and_then(|e| e.downcast_ref::<Rejected>()) {
                Some(r) => format!(
                    "server rejected the request: {}",
                    String::from_utf8_lossy(r.private_data.get(6..).unwrap_or_default())
                ),
                None => format!("connect {addr}: {e}"),
            },
        )?;
    let reply = Reply::decode(
        &ep.established()
            .map(|e| e.private_data.clone())
            .unwrap_or_default(),
    )?;
    let mulpdu = ep.connection().datapath().mulpdu();
    let size = a.size as usize;
    let mut mem = VecMemory::new();
    let bufs = mem.add(vec![0; size * depth as usize]);
    let ctrl = mem.add(vec![0; (depth as usize + 1) * CTRL_LEN]);
    let pattern = Pattern::new(a.seed, a.flags & F_STAMPS != 0);
    if a.op != Op::Read {
        pattern.prepare(region_mut(&mut mem, bufs));
    }
    let conn = ep.connection_mut();
    let sink = if a.op == Op::Read {
        conn.datapath_mut()
            .register(bufs, 0, (size * depth as usize) as u64, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?
    } else {
        Stag(0)
    };
    for k in 0..=depth as usize {
        let sge = Sge {
            region: ctrl,
            offset: k * CTRL_LEN,
            len: CTRL_LEN,
        };
        conn.datapath_mut()
            .post_recv(RecvWr {
                wr_id: WR_CTRL + k as u64,
                sge,
            })
            .map_err(|e| e.to_string())?;
    }

    let mut posted_at = Vec::with_capacity(a.iters as usize);
    let mut lat = Vec::with_capacity(a.iters as usize);
    let (mut next, mut acked) = (0u32, 0u32);
    let (mut local_bad, mut ack_bad) = (0u64, 0u64);
    let mut report = None;
    let start = Instant::now();
    let mut end = start;
    while report.is_none() {
        while next < a.iters && next < acked.saturating_add(depth) {
            let at = (next % depth) as usize * size;
            let conn = ep.connection_mut();
            match a.op {
                Op::Send => {
                    pattern.fill(next, &mut region_mut(&mut mem, bufs)[at..at + size]);
                    conn.datapath_mut()
                        .post_send(SendWr {
                            wr_id: u64::from(next),
                            kind: SendKind::Send,
                            payload: Payload::region(bufs, at, size),
                            signaled: false,
                        })
                        .map_err(|e| e.to_string())?;
                }
                Op::Write => {
                    pattern.fill(next, &mut region_mut(&mut mem, bufs)[at..at + size]);
                    conn.datapath_mut()
                        .post_write(WriteWr {
                            wr_id: u64::from(next),
                            remote_stag: reply.stag,
                            remote_to: reply.base_to + at as u64,
                            payload: Payload::region(bufs, at, size),
                            signaled: false,
                        })
                        .map_err(|e| e.to_string())?;
                    conn.datapath_mut()
                        .post_send(ctrl_send(WR_SEND_CTRL, Ctrl::Done { iter: next }, false))
                        .map_err(|e| e.to_string())?;
                }
                Op::Read => {
                    conn.datapath_mut()
                        .post_read(ReadWr {
                            wr_id: u64::from(next),
                            local_stag: sink,
                            local_to: at as u64,
                            remote_stag: reply.stag,
                            remote_to: reply.base_to + at as u64,
                            len: size as u32,
                            signaled: true,
                        })
                        .map_err(|e| e.to_string())?;
                }
            }
            posted_at.push(Instant::now());
            next += 1;
        }
        let cs = completions(&mut ep, &mut mem, a.timeout).map_err(|e| e.to_string())?;
        let now = Instant::now();
        for c in cs {
            if !c.status.is_success() {
                return Err(format!("work request failed: {c:?}"));
            }
            match c.opcode {
                WcOpcode::Recv => {
                    let k = c.wr_id.wrapping_sub(WR_CTRL) as usize;
                    let at = k * CTRL_LEN;
                    let msg = Ctrl::decode(&region(&mem, ctrl)[at..at + c.byte_len as usize])?;
                    let sge = Sge {
                        region: ctrl,
                        offset: at,
                        len: CTRL_LEN,
                    };
                    ep.connection_mut()
                        .datapath_mut()
                        .post_recv(RecvWr {
                            wr_id: c.wr_id,
                            sge,
                        })
                        .map_err(|e| e.to_string())?;
                    match msg {
                        Ctrl::Ack { iter, ok } => {
                            if iter != acked {
                                return Err(format!("Ack for {iter}, expected {acked}"));
                            }
                            ack_bad += u64::from(!ok);
                            if a.op != Op::Read {
                                lat.push(now - posted_at[iter as usize]);
                                end = now;
                            }
                            acked += 1;
                        }
                        Ctrl::Report { handled, bad } => report = Some((handled, bad)),
                        Ctrl::Done { .. } => return Err("Done from the server".into()),
                    }
                }
                WcOpcode::Read => {
                    let iter = c.wr_id as u32;
                    lat.push(now - posted_at[iter as usize]);
                    end = now;
                    let at = (iter % depth) as usize * size;
                    if let Err(off) = pattern.check(iter, &region(&mem, bufs)[at..at + size]) {
                        eprintln!("iteration {iter}: read data differs at offset {off}");
                        local_bad += 1;
                    }
                    ep.connection_mut()
                        .datapath_mut()
                        .post_send(ctrl_send(WR_SEND_CTRL, Ctrl::Done { iter }, false))
                        .map_err(|e| e.to_string())?;
                }
                _ => {}
            }
        }
    }
    let (handled, server_bad) = report.unwrap_or_default();
    Ok(Outcome {
        elapsed: end - start,
        lat,
        local_bad,
        ack_bad,
        handled,
        server_bad,
        mulpdu,
        depth,
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

fn client(args: &[String]) -> Result<bool, String> {
    let mut it = args.iter();
    let addr = it.next().ok_or("client: HOST[:PORT] missing")?.clone();
    let mut a = ClientArgs {
        addr,
        op: Op::Send,
        size: 0,
        iters: 1000,
        depth: 0,
        flags: 0,
        rev: 2,
        mss: None,
        seed: 0,
        timeout: Duration::from_secs(60),
    };
    let mut size = None;
    let mut seed = None;
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--op" => {
                a.op = match it.next().map(String::as_str) {
                    Some("send") => Op::Send,
                    Some("write") => Op::Write,
                    Some("read") => Op::Read,
                    other => return Err(format!("--op send|write|read, not {other:?}")),
                }
            }
            "--size" => size = Some(value::<u64>(&mut it, arg)?),
            "--iters" => a.iters = value(&mut it, arg)?,
            "--depth" => a.depth = value::<u32>(&mut it, arg)?.max(1),
            "--markers" => a.flags |= F_MARKERS,
            "--no-crc" => a.flags |= F_NO_CRC,
            "--aligned" => a.flags |= F_ALIGNED,
            "--verify" => match it.next().map(String::as_str) {
                Some("full") => a.flags &= !F_STAMPS,
                Some("stamps") => a.flags |= F_STAMPS,
                other => return Err(format!("--verify full|stamps, not {other:?}")),
            },
            "--mpa-rev" => {
                a.rev = value(&mut it, arg)?;
                if a.rev != 1 && a.rev != 2 {
                    return Err("--mpa-rev 1|2".into());
                }
            }
            "--mss" => a.mss = Some(value(&mut it, arg)?),
            "--seed" => seed = Some(value(&mut it, arg)?),
            "--timeout" => a.timeout = Duration::from_secs(value(&mut it, arg)?),
            other => return Err(format!("unknown client option {other}")),
        }
    }
    a.size = size.ok_or("--size BYTES missing")?;
    if a.depth == 0 {
        a.depth = ((2u64 << 20) / a.size.max(1)).clamp(2, 16) as u32;
    }
    if a.size > u64::from(u32::MAX) {
        return Err("--size must be below 4 GiB (RFC 5041 §5.2)".into());
    }
    a.seed = seed.unwrap_or_else(|| {
        splitmix(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
        )
    });
    let o = run_client(&a)?;
    let bytes = a.size as f64 * f64::from(a.iters);
    let secs = o.elapsed.as_secs_f64().max(1e-9);
    let mut sorted = o.lat.clone();
    sorted.sort();
    let avg = if sorted.is_empty() {
        Duration::ZERO
    } else {
        sorted.iter().sum::<Duration>() / sorted.len() as u32
    };
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "# iwarp-perf {} to {}: depth {}, crc {}, markers {}, MPA rev {}, MULPDU {}, verify {}",
        a.op.name(),
        a.addr,
        o.depth,
        if a.flags & F_NO_CRC != 0 { "off" } else { "on" },
        if a.flags & F_MARKERS != 0 {
            "on"
        } else {
            "off"
        },
        a.rev,
        o.mulpdu,
        if a.flags & F_STAMPS != 0 {
            "stamps"
        } else {
            "full"
        }
    );
    println!(
        "{:>10} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "bytes", "iters", "Gbit/s", "MB/s", "avg_us", "p50_us", "p99_us"
    );
    println!(
        "{:>10} {:>8} {:>10.3} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
        a.size,
        a.iters,
        bytes * 8.0 / secs / 1e9,
        bytes / secs / 1e6,
        us(avg),
        us(percentile(&sorted, 0.5)),
        us(percentile(&sorted, 0.99))
    );
    let ok = o.local_bad == 0 && o.ack_bad == 0 && o.server_bad == 0 && o.handled == a.iters;
    println!(
        "# data check: {} (server handled {} of {}, {} bad; {} bad Acks; client found {} bad)",
        if ok { "OK" } else { "FAILED" },
        o.handled,
        a.iters,
        o.server_bad,
        o.ack_bad,
        o.local_bad
    );
    Ok(ok)
}

fn value<T: std::str::FromStr>(
    it: &mut std::slice::Iter<'_, String>,
    name: &str,
) -> Result<T, String> {
    it.next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{name} needs a valid value"))
}

const USAGE: &str = "usage:
  iwarp-perf server [--port N] [--bind ADDR] [--once]
  iwarp-perf client HOST[:PORT] --op send|write|read --size BYTES [--iters N]
             [--depth N] [--markers] [--no-crc] [--mpa-rev 1|2] [--mss N]
             [--aligned] [--verify full|stamps] [--seed N] [--timeout SECS]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("server") => server(&args[1..]).map(|()| true),
        Some("client") => client(&args[1..]),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => Err(USAGE.to_owned()),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("iwarp-perf: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_round_trip_and_detects_errors() {
        let p = Pattern::new(42, false);
        for len in [0, 1, 7, 8, 9, BLOCK - 1, BLOCK, BLOCK + 3, 3 * BLOCK + 5] {
            let mut buf = vec![0u8; len];
            p.fill(3, &mut buf);
            assert_eq!(p.check(3, &buf), Ok(()), "{len}");
            if len > 0 {
                // Another iteration's data never passes.
                assert!(p.check(4, &buf).is_err(), "{len}");
                let i = len / 2;
                buf[i] ^= 1;
                assert_eq!(p.check(3, &buf), Err(i), "{len}");
            }
        }
        // Blocks differ from each other.
        let mut buf = vec![0u8; 2 * BLOCK];
        p.fill(0, &mut buf);
        assert_ne!(buf[..BLOCK], buf[BLOCK..]);
    }

    #[test]
    fn stamps() {
        let p = Pattern::new(42, true);
        for len in [0, 1, 7, 8, 9, PAGE - 1, PAGE, PAGE + 3, 3 * PAGE + 5] {
            let mut buf = vec![0u8; len];
            p.prepare(&mut buf);
            p.fill(3, &mut buf);
            assert_eq!(p.check(3, &buf), Ok(()), "{len}");
            if len > 0 {
                assert_eq!(p.check(4, &buf), Err(0), "{len}");
                let last = (len - 1) / PAGE * PAGE;
                buf[last] ^= 1;
                assert_eq!(p.check(3, &buf), Err(last), "{len}");
            }
        }
    }

    #[test]
    fn messages_round_trip() {
        let r = Request {
            op: Op::Read,
            flags: F_MARKERS | F_NO_CRC,
            size: 65536,
            iters: 10,
            depth: 4,
            seed: 0x0102_0304_0506_0708,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        assert!(Request::decode(&r.encode()[..31]).is_err());
        let reply = Reply {
            stag: Stag(0x1234_5678),
            base_to: 99,
        };
        assert_eq!(Reply::decode(&reply.encode()), Ok(reply));
        for c in [
            Ctrl::Done { iter: 5 },
            Ctrl::Ack { iter: 6, ok: false },
            Ctrl::Report { handled: 7, bad: 1 },
        ] {
            assert_eq!(Ctrl::decode(&c.encode()), Ok(c));
        }
    }
}
