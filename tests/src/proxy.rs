//! User-space proxies that put faults between two preloaded programs, for
//! the fault tests (`tests/tests/e2e_faults.rs`).
//!
//! * [`UdpProxy`] sits between the programs and their port mapper
//!   (`SDP_PM_PORT` names the proxy): it drops a share of the datagrams
//!   each way with a seeded generator, and can send the SDP connection
//!   elsewhere by rewriting the ApPort of every PMAccept (and giving the
//!   PMAck back its original one, so the daemon still matches it).
//! * [`TcpProxy`] forwards TCP connections to one address, reading the MPA
//!   stream as it passes (RFC 5044: the Request and Reply frames, then the
//!   FPDUs, without markers): it can flip one byte in the middle of one
//!   FPDU's ULPDU towards the server, and it records the Terminates
//!   (RFC 5040 §4.8) each way.
//!
//! Together they are the hook to put a proxy on an SDP connection's path
//! without changing the preload: the client's port mapper answer names the
//! proxy instead of the server's hidden SDP port.

use portmapper::wire::{MessageRepr, MsgType};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the proxies' loops look at their stop flag.
const TICK: Duration = Duration::from_millis(20);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A seeded xorshift64* generator: the same seed drops the same datagrams
/// of the same sequence.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// True with probability `percent` / 100.
    pub fn percent(&mut self, percent: u32) -> bool {
        (self.next_u64() >> 11) % 100 < u64::from(percent)
    }
}

/// What a [`UdpProxy`] does.
#[derive(Clone, Copy, Debug)]
pub struct UdpProxyConfig {
    /// The port mapper daemon.
    pub upstream: SocketAddr,
    /// Share of the datagrams dropped, each way, in percent.
    pub drop_percent: u32,
    /// Seed of the drop decisions.
    pub seed: u64,
    /// Every PMAccept names this port as ApPort instead of its own.
    pub redirect: Option<u16>,
    /// The daemon's answers are all withheld (the programs' queries still
    /// reach it): a transaction stays open on the daemon's side.
    pub withhold_answers: bool,
}

/// What a [`UdpProxy`] saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams from the programs, forwarded to the daemon.
    pub to_daemon: u64,
    /// Datagrams from the programs, dropped.
    pub dropped_to_daemon: u64,
    /// Datagrams from the daemon, forwarded to the programs.
    pub to_client: u64,
    /// Datagrams from the daemon, dropped.
    pub dropped_to_client: u64,
    /// PMAccepts forwarded.
    pub accepts: u64,
    /// PMDenies forwarded.
    pub denies: u64,
    /// PMAccepts whose ApPort was rewritten.
    pub redirected: u64,
}

/// See the module documentation. Stops when dropped.
pub struct UdpProxy {
    /// The UDP port on 127.0.0.1 the programs send to.
    pub port: u16,
    stats: Arc<Mutex<UdpStats>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl UdpProxy {
    pub fn start(cfg: UdpProxyConfig) -> UdpProxy {
        let down = UdpSocket::bind("127.0.0.1:0").expect("bind the UDP proxy");
        down.set_nonblocking(true).expect("nonblocking UDP proxy");
        let port = down.local_addr().expect("UDP proxy address").port();
        let stats = Arc::new(Mutex::new(UdpStats::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stats, stop) = (stats.clone(), stop.clone());
            std::thread::spawn(move || udp_loop(cfg, down, &stats, &stop))
        };
        UdpProxy {
            port,
            stats,
            stop,
            thread: Some(thread),
        }
    }

    pub fn stats(&self) -> UdpStats {
        *lock(&self.stats)
    }
}

impl Drop for UdpProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One program's socket towards the daemon, so that the daemon's answers
/// (and its PMAck check, which compares addresses) see one peer per
/// program socket.
struct Flow {
    client: SocketAddr,
    up: UdpSocket,
}

fn udp_loop(cfg: UdpProxyConfig, down: UdpSocket, stats: &Mutex<UdpStats>, stop: &AtomicBool) {
    let mut rng = Rng::new(cfg.seed);
    let mut flows: Vec<Flow> = Vec::new();
    let mut by_client: HashMap<SocketAddr, usize> = HashMap::new();
    // AssocHandle → the ApPort the daemon named, for the PMAck.
    let mut original: HashMap<u64, u16> = HashMap::new();
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Acquire) {
        let mut fds: Vec<libc::pollfd> = std::iter::once(down.as_raw_fd())
            .chain(flows.iter().map(|f| f.up.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: a live array of pollfds of sockets we hold.
        unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                TICK.as_millis() as i32,
            )
        };
        // From the programs.
        while let Ok((n, from)) = down.recv_from(&mut buf) {
            let dropped = rng.percent(cfg.drop_percent);
            let mut s = lock(stats);
            if dropped {
                s.dropped_to_daemon += 1;
                continue;
            }
            s.to_daemon += 1;
            drop(s);
            let mut data = buf[..n].to_vec();
            if let Ok(mut m) = MessageRepr::parse_bytes(&data) {
                if m.mtype == MsgType::ACK {
                    if let Some(&q) = original.get(&m.assoc_handle) {
                        m.ap_port = q;
                        data = m.to_bytes().to_vec();
                    }
                }
            }
            let i = *by_client.entry(from).or_insert_with(|| {
                let up = UdpSocket::bind("127.0.0.1:0").expect("bind a UDP proxy flow");
                up.connect(cfg.upstream).expect("connect a UDP proxy flow");
                up.set_nonblocking(true)
                    .expect("nonblocking UDP proxy flow");
                flows.push(Flow { client: from, up });
                flows.len() - 1
            });
            let _ = flows[i].up.send(&data);
        }
        // From the daemon.
        for f in &flows {
            while let Ok(n) = f.up.recv(&mut buf) {
                let dropped = cfg.withhold_answers || rng.percent(cfg.drop_percent);
                let mut s = lock(stats);
                if dropped {
                    s.dropped_to_client += 1;
                    continue;
                }
                s.to_client += 1;
                let mut data = buf[..n].to_vec();
                if let Ok(mut m) = MessageRepr::parse_bytes(&data) {
                    match m.mtype {
                        MsgType::ACCEPT => {
                            s.accepts += 1;
                            if let Some(port) = cfg.redirect {
                                original.insert(m.assoc_handle, m.ap_port);
                                m.ap_port = port;
                                data = m.to_bytes().to_vec();
                                s.redirected += 1;
                            }
                        }
                        MsgType::DENY => s.denies += 1,
                        _ => {}
                    }
                }
                drop(s);
                let _ = down.send_to(&data, f.client);
            }
        }
    }
}

/// Which byte a [`TcpProxy`] flips, once, on its first connection: in
/// the middle of the ULPDU of the first FPDU of a Data Message towards the
/// server (past its DDP, RDMAP and SDP headers) that starts after `after`
/// bytes of FPDUs and has at least `min_ulpdu` bytes of ULPDU.
///
/// With `pause`, the proxy also shapes the arrival: it holds back one whole
/// message and the corrupted FPDU behind it, waits `pause` (the reader
/// takes everything before and waits for more), then delivers both in one
/// write: a waiting reader gets a good message and the bad FPDU together.
#[derive(Clone, Copy, Debug)]
pub struct Corrupt {
    pub after: u64,
    pub min_ulpdu: usize,
    /// XORed into the byte.
    pub xor: u8,
    pub pause: Option<Duration>,
}

/// The byte a [`TcpProxy`] flipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flip {
    /// Offset in the client→server TCP stream.
    pub stream_offset: u64,
    /// Which FPDU of that stream (0: the first after the MPA Request).
    pub fpdu: u64,
    /// The FPDU's ULPDU_Length, and the flipped byte's index in the ULPDU.
    pub ulpdu_len: usize,
    pub index: usize,
    /// Bytes of FPDUs (a whole message) delivered in the same write, just
    /// before it.
    pub delivered_with: usize,
}

/// A Terminate seen on the wire: its Layer, EType and Error Code
/// (RFC 5040 §4.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terminate {
    pub layer: u8,
    pub etype: u8,
    pub code: u8,
}

/// What a [`TcpProxy`] saw.
#[derive(Clone, Debug, Default)]
pub struct TcpReport {
    /// Connections taken.
    pub connections: usize,
    /// FPDUs seen towards the server and towards the client.
    pub fpdus_to_server: u64,
    pub fpdus_to_client: u64,
    pub flip: Option<Flip>,
    /// Terminates sent by the server (towards the client) and by the client.
    pub terminates_from_server: Vec<Terminate>,
    pub terminates_from_client: Vec<Terminate>,
    /// A stream that was not MPA as expected, or used markers (the proxy
    /// then only forwarded it).
    pub unparsed: Vec<String>,
}

#[derive(Default)]
struct TcpShared {
    report: Mutex<TcpReport>,
    /// Every socket, for the shutdown at the end.
    socks: Mutex<Vec<TcpStream>>,
    /// M of the Reply: FPDUs to the server carry markers.
    markers_to_server: AtomicBool,
    markers_to_client: AtomicBool,
}

/// See the module documentation. Stops (and cuts its connections) when
/// dropped.
pub struct TcpProxy {
    /// The TCP port on 127.0.0.1 the client connects to.
    pub port: u16,
    shared: Arc<TcpShared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpProxy {
    pub fn start(upstream: SocketAddr, corrupt: Option<Corrupt>) -> TcpProxy {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind the TCP proxy");
        l.set_nonblocking(true).expect("nonblocking TCP proxy");
        let port = l.local_addr().expect("TCP proxy address").port();
        let shared = Arc::new(TcpShared::default());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || tcp_accept_loop(l, upstream, corrupt, &shared, &stop))
        };
        TcpProxy {
            port,
            shared,
            stop,
            thread: Some(thread),
        }
    }

    pub fn report(&self) -> TcpReport {
        lock(&self.shared.report).clone()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for s in lock(&self.shared.socks).iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn tcp_accept_loop(
    l: TcpListener,
    upstream: SocketAddr,
    corrupt: Option<Corrupt>,
    shared: &Arc<TcpShared>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Acquire) {
        let mut p = libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of a socket we hold.
        unsafe { libc::poll(&mut p, 1, TICK.as_millis() as i32) };
        let Ok((client, _)) = l.accept() else {
            continue;
        };
        let _ = client.set_nonblocking(false);
        let Ok(server) = TcpStream::connect(upstream) else {
            // The upstream refuses: so does the proxy (a reset).
            reset(&client);
            continue;
        };
        let first = {
            let mut r = lock(&shared.report);
            r.connections += 1;
            r.connections == 1
        };
        {
            let mut socks = lock(&shared.socks);
            for s in [&client, &server] {
                if let Ok(c) = s.try_clone() {
                    socks.push(c);
                }
            }
        }
        let (c2, s2) = (
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
        );
        let (sh1, sh2) = (shared.clone(), shared.clone());
        let corrupt = corrupt.filter(|_| first);
        std::thread::spawn(move || pump(client, server, Dir::ToServer, corrupt, &sh1));
        std::thread::spawn(move || pump(s2, c2, Dir::ToClient, None, &sh2));
    }
}

/// SO_LINGER 0 and close: the peer gets a reset.
fn reset(s: &TcpStream) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a linger struct for a socket we hold.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    let _ = s.shutdown(Shutdown::Both);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    ToServer,
    ToClient,
}

/// Copies `from` to `to` unit by unit (the MPA frame, then whole FPDUs),
/// through the policy of its direction; passes a reset on as a reset and
/// an end as an end.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    dir: Dir,
    corrupt: Option<Corrupt>,
    sh: &TcpShared,
) {
    let mut framer = Framer::new(dir);
    let mut policy = Policy::new(dir, corrupt);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match from.read(&mut buf) {
            Ok(0) => {
                // What is left of an unfinished unit goes as it is.
                let _ = to.write_all(&framer.rest());
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                for unit in framer.push(&buf[..n], sh) {
                    let out = policy.pass(unit, sh);
                    if !out.is_empty() && to.write_all(&out).is_err() {
                        reset(&from);
                        return;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                reset(&to);
                return;
            }
        }
    }
}

/// MPA frame header: key (16), flags, revision, PD_Length (RFC 5044 §7.1).
const FRAME_HEADER: usize = 20;
/// What the checks need of a ULPDU: the untagged DDP header (18) and the
/// Terminate Control's first two bytes.
const HEAD: usize = 20;

/// A piece of one direction's stream.
enum Unit {
    /// The MPA Request or Reply, with its private data.
    Frame(Vec<u8>),
    /// One FPDU: ULPDU_Length, ULPDU, pad, CRC (RFC 5044 §4.1).
    Fpdu(Vec<u8>),
    /// Bytes not parsed (not MPA as expected, or markers in use).
    Raw(Vec<u8>),
}

/// Cuts one direction's bytes into [`Unit`]s.
struct Framer {
    dir: Dir,
    buf: Vec<u8>,
    frame_done: bool,
    opaque: bool,
}

impl Framer {
    fn new(dir: Dir) -> Framer {
        Framer {
            dir,
            buf: Vec::new(),
            frame_done: false,
            opaque: false,
        }
    }

    fn rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    fn give_up(&mut self, why: String, sh: &TcpShared, out: &mut Vec<Unit>) {
        lock(&sh.report)
            .unparsed
            .push(format!("{:?}: {why}", self.dir));
        self.opaque = true;
        out.push(Unit::Raw(self.rest()));
    }

    fn push(&mut self, data: &[u8], sh: &TcpShared) -> Vec<Unit> {
        if self.opaque {
            return vec![Unit::Raw(data.to_vec())];
        }
        self.buf.extend_from_slice(data);
        let mut out = Vec::new();
        loop {
            if !self.frame_done {
                if self.buf.len() < FRAME_HEADER {
                    break;
                }
                let key: &[u8] = match self.dir {
                    Dir::ToServer => b"MPA ID Req Frame",
                    Dir::ToClient => b"MPA ID Rep Frame",
                };
                if &self.buf[..16] != key {
                    let got = String::from_utf8_lossy(&self.buf[..16]).into_owned();
                    self.give_up(format!("no MPA frame: {got:?}"), sh, &mut out);
                    break;
                }
                let len =
                    FRAME_HEADER + usize::from(u16::from_be_bytes([self.buf[18], self.buf[19]]));
                if self.buf.len() < len {
                    break;
                }
                // M asks for markers in the FPDUs sent to the sender of
                // the frame.
                let markers = self.buf[16] & 0x80 != 0;
                match self.dir {
                    Dir::ToServer => sh.markers_to_client.store(markers, Ordering::Release),
                    Dir::ToClient => sh.markers_to_server.store(markers, Ordering::Release),
                }
                out.push(Unit::Frame(self.buf.drain(..len).collect()));
                self.frame_done = true;
                continue;
            }
            if self.buf.len() < 2 {
                break;
            }
            // The first FPDU comes after the other direction's frame.
            let markers = match self.dir {
                Dir::ToServer => sh.markers_to_server.load(Ordering::Acquire),
                Dir::ToClient => sh.markers_to_client.load(Ordering::Acquire),
            };
            if markers {
                self.give_up("markers in use".into(), sh, &mut out);
                break;
            }
            let ulpdu = usize::from(u16::from_be_bytes([self.buf[0], self.buf[1]]));
            let total = 2 + ulpdu + (4 - (2 + ulpdu) % 4) % 4 + 4;
            if self.buf.len() < total {
                break;
            }
            out.push(Unit::Fpdu(self.buf.drain(..total).collect()));
        }
        out
    }
}

/// An FPDU's ULPDU (without length, pad and CRC).
fn ulpdu(fpdu: &[u8]) -> &[u8] {
    let len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
    &fpdu[2..2 + len]
}

/// The Terminate an FPDU carries, if it is one: untagged, RDMAP opcode
/// Terminate (RFC 5040 §4.8).
fn terminate(fpdu: &[u8]) -> Option<Terminate> {
    let u = ulpdu(fpdu);
    (u.len() >= HEAD && u[0] & 0x80 == 0 && u[1] & 0x0f == 0x7).then(|| Terminate {
        layer: u[18] >> 4,
        etype: u[18] & 0x0f,
        code: u[19],
    })
}

/// What a direction does with its units: count them, report Terminates,
/// and (towards the server) corrupt one.
struct Policy {
    dir: Dir,
    corrupt: Option<Corrupt>,
    /// Bytes of the stream so far.
    offset: u64,
    fpdu_bytes: u64,
    fpdus: u64,
    /// The previous FPDU ended a DDP message (L set): the next starts one.
    at_message_start: bool,
    /// A message held back (with `pause`), and whether it is whole.
    held: Option<(Vec<u8>, bool)>,
    flipped: bool,
}

impl Policy {
    fn new(dir: Dir, corrupt: Option<Corrupt>) -> Policy {
        Policy {
            dir,
            corrupt,
            offset: 0,
            fpdu_bytes: 0,
            fpdus: 0,
            at_message_start: true,
            held: None,
            flipped: false,
        }
    }

    /// The bytes to write for `unit` now (none while holding).
    fn pass(&mut self, unit: Unit, sh: &TcpShared) -> Vec<u8> {
        let mut f = match unit {
            Unit::Frame(b) | Unit::Raw(b) => {
                self.offset += b.len() as u64;
                return b;
            }
            Unit::Fpdu(f) => f,
        };
        let at = self.offset;
        self.offset += f.len() as u64;
        let u = ulpdu(&f);
        let last = u.first().is_some_and(|b| b & 0x40 != 0);
        let starts_message = self.at_message_start;
        self.at_message_start = last;
        {
            let mut r = lock(&sh.report);
            match self.dir {
                Dir::ToClient => {
                    r.fpdus_to_client += 1;
                    r.terminates_from_server.extend(terminate(&f));
                }
                Dir::ToServer => {
                    r.fpdus_to_server += 1;
                    r.terminates_from_client.extend(terminate(&f));
                }
            }
        }
        let index = self.fpdus;
        self.fpdus += 1;
        self.fpdu_bytes += f.len() as u64;
        let Some(c) = self.corrupt.filter(|_| !self.flipped) else {
            return f;
        };
        let due = self.fpdu_bytes - f.len() as u64 >= c.after && starts_message;
        if c.pause.is_some() && self.held.is_none() && due {
            // Hold this whole message; the FPDU after it is the one.
            self.held = Some((f, last));
            return Vec::new();
        }
        if let Some((held, whole)) = &mut self.held {
            if !*whole {
                held.extend_from_slice(&f);
                *whole = last;
                return Vec::new();
            }
        }
        let len = u.len();
        let due = match &self.held {
            Some(_) => len >= c.min_ulpdu,
            None => due && len >= c.min_ulpdu,
        };
        if !due {
            return match &mut self.held {
                // Not long enough to be a Data Message's: on with the wait.
                Some((held, _)) => {
                    held.extend_from_slice(&f);
                    Vec::new()
                }
                None => f,
            };
        }
        let index_in_ulpdu = len / 2;
        f[2 + index_in_ulpdu] ^= c.xor;
        self.flipped = true;
        let (mut out, delivered_with) = match self.held.take() {
            Some((held, _)) => {
                let n = held.len();
                (held, n)
            }
            None => (Vec::new(), 0),
        };
        lock(&sh.report).flip = Some(Flip {
            stream_offset: at + 2 + index_in_ulpdu as u64,
            fpdu: index,
            ulpdu_len: len,
            index: index_in_ulpdu,
            delivered_with,
        });
        if let Some(p) = c.pause {
            // Shaping the fault, not waiting for an event: the reader has
            // had everything before; now it waits for more.
            std::thread::sleep(p);
        }
        out.extend_from_slice(&f);
        out
    }
}
