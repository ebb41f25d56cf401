//! The daemon's event loop: UDP sockets and the control socket around the
//! sans-IO [`Server`]. Single-threaded; poll(2) waits for sockets, signals
//! and the server's next timer.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use portmapper::control::{Request, MAX_LINE};
use portmapper::procnet;
use portmapper::server::{Action, RegisterError, Server, ServerConfig, Stats};

use crate::config::{self, Loader};
use crate::log::{Level, Logger};
use crate::sys::{self, Signal};

/// Daemon settings (see docs/portmapper.md).
#[derive(Debug, Clone)]
pub struct Options {
    pub port: u16,
    pub binds: Vec<IpAddr>,
    pub control: PathBuf,
    pub server: ServerConfig,
    pub max_control_conns: usize,
    pub stats_interval: Duration,
    pub log: Logger,
}

/// Output a control connection may have queued before it is cut off.
const MAX_CONTROL_OUTPUT: usize = 8 << 20;
/// Output all control connections together may have queued; past it, LIST
/// is refused ("ERR busy") until clients read what they asked for.
const MAX_TOTAL_CONTROL_OUTPUT: usize = 16 << 20;
/// Datagrams handled per socket per wake-up, so control traffic and timers
/// keep running under a flood.
const UDP_BATCH: usize = 1024;

struct Conn {
    stream: UnixStream,
    id: u64,
    pid: i32,
    uid: u32,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    closed: bool,
}

struct Daemon {
    opts: Options,
    /// Where the settings came from, to load them again on SIGHUP.
    loader: Loader,
    next_stats: Instant,
    log: Logger,
    server: Server,
    udp: Vec<UdpSocket>,
    conns: Vec<Conn>,
    next_id: u64,
    tx_errors: u64,
    last_stats: Stats,
}

fn bind_udp(opts: &Options) -> io::Result<Vec<UdpSocket>> {
    let mut port = opts.port;
    let mut out = Vec::new();
    if opts.binds.is_empty() {
        // [::] is dual-stack on Linux unless net.ipv6.bindv6only=1; without
        // IPv6 (or with bindv6only) fall back to / add IPv4.
        match UdpSocket::bind(SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)) {
            Ok(s) => {
                port = s.local_addr()?.port();
                out.push(s);
                if let Ok(s4) =
                    UdpSocket::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port))
                {
                    out.push(s4);
                }
            }
            Err(_) => out.push(UdpSocket::bind(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                port,
            ))?),
        }
    } else {
        for &a in &opts.binds {
            let s = UdpSocket::bind(SocketAddr::new(a, port))?;
            port = s.local_addr()?.port();
            out.push(s);
        }
    }
    for s in &out {
        s.set_nonblocking(true)?;
    }
    Ok(out)
}

fn bind_control(path: &PathBuf) -> io::Result<UnixListener> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a daemon already serves {}", path.display()),
            ));
        }
        // Left over by a daemon that did not shut down cleanly.
        fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            fs::create_dir_all(dir)?;
            // Every local user must reach the socket, whatever the umask.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
        }
    }
    let l = UnixListener::bind(path)?;
    // Every local user may connect: LIST is public, and a registration is
    // accepted only from a process the kernel (SO_PEERCRED) and /proc show
    // holding both listeners (see `control_request`).
    fs::set_permissions(path, fs::Permissions::from_mode(0o666))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

pub fn run(opts: Options, loader: Loader) -> io::Result<()> {
    let log = opts.log;
    let sig = sys::daemon_signals()?;
    let udp = bind_udp(&opts)?;
    let listener = bind_control(&opts.control)?;
    let addrs: Vec<String> = udp
        .iter()
        .filter_map(|s| s.local_addr().ok())
        .map(|a| a.to_string())
        .collect();
    let addrs = addrs.join(",");
    log.log(
        Level::Info,
        "started",
        &[
            ("udp", &addrs),
            ("control", &opts.control.display()),
            ("pid", &std::process::id()),
        ],
    );
    // The ready line lets a supervisor (or a test) learn the bound port.
    {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "ready udp={addrs} control={}", opts.control.display());
        let _ = out.flush();
    }
    let mut d = Daemon {
        server: Server::new(opts.server.clone()),
        next_stats: Instant::now() + opts.stats_interval,
        opts,
        loader,
        log,
        udp,
        conns: Vec::new(),
        next_id: 1,
        tx_errors: 0,
        last_stats: Stats::default(),
    };
    let r = d.event_loop(&sig, &listener);
    let _ = fs::remove_file(&d.opts.control);
    d.log_stats(Level::Info, "shutdown");
    r
}

impl Daemon {
    fn event_loop(&mut self, sig: &UnixStream, listener: &UnixListener) -> io::Result<()> {
        loop {
            let mut fds = Vec::with_capacity(2 + self.udp.len() + self.conns.len());
            let pfd = |fd, events| sys::pollfd {
                fd,
                events,
                revents: 0,
            };
            fds.push(pfd(sig.as_raw_fd(), sys::POLLIN));
            fds.push(pfd(listener.as_raw_fd(), sys::POLLIN));
            for s in &self.udp {
                fds.push(pfd(s.as_raw_fd(), sys::POLLIN));
            }
            for c in &self.conns {
                // Read the next request only when the last reply is out.
                let ev = if c.out_pos < c.out.len() {
                    sys::POLLOUT
                } else {
                    sys::POLLIN
                };
                fds.push(pfd(c.stream.as_raw_fd(), ev));
            }
            let now = Instant::now();
            let mut wake = self.server.poll_timeout();
            if !self.opts.stats_interval.is_zero() {
                let next_stats = self.next_stats;
                wake = Some(wake.map_or(next_stats, |w| w.min(next_stats)));
            }
            let timeout = match wake {
                None => -1,
                // Round up so that the deadline has passed when we wake.
                Some(w) => {
                    let d = w.saturating_duration_since(now);
                    (d.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
                }
            };
            sys::poll(&mut fds, timeout)?;
            let now = Instant::now();

            if fds[0].revents != 0 {
                match sys::read_signals(sig) {
                    Some(Signal::Shutdown) => {
                        self.log
                            .log(Level::Info, "signal", &[("action", &"shutdown")]);
                        return Ok(());
                    }
                    Some(Signal::Reload) => self.reload(now),
                    None => {}
                }
            }
            if fds[1].revents != 0 {
                self.accept_control(listener);
            }
            for i in 0..self.udp.len() {
                if fds[2 + i].revents != 0 {
                    self.serve_udp(now, i);
                }
            }
            let base = 2 + self.udp.len();
            let n = self.conns.len();
            for i in 0..n {
                let r = fds.get(base + i).map_or(0, |f| f.revents);
                if r != 0 {
                    self.serve_conn(now, i, r);
                }
            }
            self.reap_conns();

            for p in self.server.handle_timeout(now) {
                if self.log.enabled(Level::Debug) {
                    self.log.log(
                        Level::Debug,
                        "expired",
                        &[
                            ("handle", &format_args!("{:#018x}", p.assoc_handle)),
                            ("cp", &SocketAddr::new(p.key.cp_addr, p.key.cp_port)),
                            ("ap", &SocketAddr::new(p.key.ap_addr, p.key.ap_port)),
                        ],
                    );
                }
            }
            if !self.opts.stats_interval.is_zero() && now >= self.next_stats {
                self.next_stats = now + self.opts.stats_interval;
                self.periodic_stats();
            }
        }
    }

    /// SIGHUP: load the settings again and apply those that can change while
    /// running; registrations, pending transactions and counters stay. On
    /// an error the settings in force stay as they are.
    fn reload(&mut self, now: Instant) {
        self.log
            .log(Level::Info, "signal", &[("action", &"reload")]);
        let Some(file) = self.loader.file.clone() else {
            self.log.log(
                Level::Info,
                "reload_skipped",
                &[("reason", &"nothing to reload: no --config file")],
            );
            return;
        };
        let new = match self.loader.load() {
            Ok(o) => o,
            Err(e) => {
                self.log.log(
                    Level::Error,
                    "reload_failed",
                    &[
                        ("config", &file.display()),
                        ("error", &e),
                        ("action", &"kept the settings in force"),
                    ],
                );
                return;
            }
        };
        let mut changed = Vec::new();
        for &name in config::NAMES {
            let (old_v, new_v) = (
                config::value_of(&self.opts, name),
                config::value_of(&new, name),
            );
            if old_v == new_v {
                continue;
            }
            if config::RESTART.contains(&name) {
                self.log.log(
                    Level::Warn,
                    "reload_needs_restart",
                    &[
                        ("setting", &name),
                        ("running", &old_v),
                        ("configured", &new_v),
                        ("reason", &"needs a restart"),
                    ],
                );
            } else {
                changed.push(format!("{name}={new_v}"));
            }
        }
        let stats_changed = new.stats_interval != self.opts.stats_interval;
        // The sockets stay as they are until a restart.
        let new = Options {
            port: self.opts.port,
            binds: std::mem::take(&mut self.opts.binds),
            control: std::mem::take(&mut self.opts.control),
            ..new
        };
        self.server.set_config(new.server.clone());
        self.log = new.log;
        self.opts = new;
        if stats_changed {
            self.next_stats = now + self.opts.stats_interval;
        }
        let changed = if changed.is_empty() {
            "none".to_string()
        } else {
            changed.join(" ")
        };
        self.log.log(
            Level::Info,
            "reloaded",
            &[("config", &file.display()), ("changed", &changed)],
        );
    }

    fn serve_udp(&mut self, now: Instant, i: usize) {
        let mut buf = [0u8; 128];
        for _ in 0..UDP_BATCH {
            let Some(sock) = self.udp.get(i) else { return };
            let (n, from) = match sock.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors for earlier replies surface here; harmless.
                    self.log.log(Level::Debug, "udp_error", &[("error", &e)]);
                    continue;
                }
            };
            // Datagrams longer than the buffer arrive cut to its size, still
            // longer than a message, so they count as too long.
            let h = self.server.handle_datagram(now, from, &buf[..n]);
            if let Some(reply) = h.reply {
                if sock.send_to(&reply, from).is_err() {
                    self.tx_errors += 1;
                }
            }
            if self.log.enabled(Level::Debug) {
                self.log_action(from, &h);
            }
        }
    }

    fn log_action(&self, from: SocketAddr, h: &portmapper::server::Handled) {
        let what: &str = match h.action {
            Action::Malformed(_) => "malformed",
            Action::RateLimited => "rate_limited",
            Action::Accepted { .. } => "accept",
            Action::Denied { .. } => "deny",
            Action::Acked => "acked",
            Action::StrayAck => "stray_ack",
            Action::StrayReply => "stray_reply",
        };
        let detail = match h.action {
            Action::Malformed(e) => e.to_string(),
            Action::Accepted {
                sdp_port,
                duplicate,
                replaced,
                evicted,
            } => format!(
                "sdp_port={sdp_port} duplicate={duplicate} replaced={replaced} evicted={evicted}"
            ),
            Action::Denied {
                duplicate,
                replaced,
            } => format!("duplicate={duplicate} replaced={replaced}"),
            _ => String::new(),
        };
        let msg = h.msg.map(|m| m.to_string()).unwrap_or_default();
        self.log.log(
            Level::Debug,
            what,
            &[("from", &from), ("message", &msg), ("detail", &detail)],
        );
    }

    fn accept_control(&mut self, listener: &UnixListener) {
        loop {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.log
                        .log(Level::Warn, "control_accept_error", &[("error", &e)]);
                    return;
                }
            };
            if self.conns.len() >= self.opts.max_control_conns {
                let _ = (&stream).write_all(b"ERR too many control connections\n");
                self.log.log(
                    Level::Warn,
                    "control_refused",
                    &[("reason", &"too many connections")],
                );
                continue;
            }
            let cred = match sys::peer_cred(&stream) {
                Ok(c) => c,
                Err(e) => {
                    self.log
                        .log(Level::Warn, "control_refused", &[("error", &e)]);
                    continue;
                }
            };
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.log.log(
                Level::Debug,
                "control_open",
                &[("conn", &id), ("pid", &cred.pid), ("uid", &cred.uid)],
            );
            self.conns.push(Conn {
                stream,
                id,
                pid: cred.pid,
                uid: cred.uid,
                inbuf: Vec::new(),
                out: Vec::new(),
                out_pos: 0,
                closed: false,
            });
        }
    }

    fn serve_conn(&mut self, now: Instant, i: usize, revents: i16) {
        if revents & sys::POLLOUT != 0 {
            self.flush(i);
            return;
        }
        if revents & (sys::POLLIN | sys::POLLHUP | sys::POLLERR) == 0 {
            return;
        }
        let mut buf = [0u8; 512];
        let n = {
            let Some(c) = self.conns.get_mut(i) else {
                return;
            };
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    c.closed = true;
                    return;
                }
                Ok(n) => n,
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::Interrupted =>
                {
                    return
                }
                Err(_) => {
                    c.closed = true;
                    return;
                }
            }
        };
        if let Some(c) = self.conns.get_mut(i) {
            c.inbuf.extend_from_slice(&buf[..n]);
        }
        loop {
            let Some(c) = self.conns.get_mut(i) else {
                return;
            };
            let Some(pos) = c.inbuf.iter().position(|&b| b == b'\n') else {
                if c.inbuf.len() > MAX_LINE {
                    c.closed = true;
                }
                return;
            };
            if pos >= MAX_LINE {
                c.closed = true;
                return;
            }
            let line: Vec<u8> = c.inbuf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line).into_owned();
            let reply = self.control_request(now, i, &line);
            if let Some(c) = self.conns.get_mut(i) {
                c.out.extend_from_slice(reply.as_bytes());
                if c.out.len() - c.out_pos > MAX_CONTROL_OUTPUT {
                    c.closed = true;
                    return;
                }
            }
            self.flush(i);
        }
    }

    fn flush(&mut self, i: usize) {
        let Some(c) = self.conns.get_mut(i) else {
            return;
        };
        while c.out_pos < c.out.len() {
            match c.stream.write(&c.out[c.out_pos..]) {
                Ok(0) => {
                    c.closed = true;
                    return;
                }
                Ok(n) => c.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    c.closed = true;
                    return;
                }
            }
        }
        c.out.clear();
        c.out_pos = 0;
    }

    fn reap_conns(&mut self) {
        let mut i = 0;
        while i < self.conns.len() {
            if !self.conns[i].closed {
                i += 1;
                continue;
            }
            let c = self.conns.swap_remove(i);
            // The registering process closed the connection or exited.
            for r in self.server.unregister_owner(c.id) {
                self.log.log(
                    Level::Info,
                    "unregistered",
                    &[
                        ("addr", &r.addr),
                        ("port", &r.port),
                        ("sdp_port", &r.sdp_port),
                        ("pid", &c.pid),
                        ("reason", &"control connection closed"),
                    ],
                );
            }
        }
    }

    fn control_request(&mut self, now: Instant, i: usize, line: &str) -> String {
        let Some(c) = self.conns.get(i) else {
            return String::new();
        };
        let (id, pid, uid) = (c.id, c.pid, c.uid);
        let req = match Request::parse(line) {
            Ok(r) => r,
            Err(_) => return "ERR bad request\n".into(),
        };
        match req {
            Request::Register {
                addr,
                port,
                sdp_port,
            } => {
                let refuse = |this: &Self, reason: &str| {
                    this.log.log(
                        Level::Warn,
                        "register_refused",
                        &[
                            ("addr", &addr),
                            ("port", &port),
                            ("sdp_port", &sdp_port),
                            ("pid", &pid),
                            ("uid", &uid),
                            ("reason", &reason),
                        ],
                    );
                    format!("ERR {reason}\n")
                };
                if port == sdp_port {
                    return refuse(self, "P and Q must differ");
                }
                let Ok(upid) = u32::try_from(pid) else {
                    return refuse(self, "unknown peer process");
                };
                if upid == 0 {
                    return refuse(self, "unknown peer process");
                }
                // DESIGN §5: "The daemon accepts a registration only from a
                // process that really listens on P".
                let mut verified = "process";
                let check = procnet::listening_sockets().and_then(|table| {
                    match procnet::socket_inodes(upid) {
                        Ok(inodes) => Ok((
                            procnet::holds_listener(&table, &inodes, addr, port),
                            procnet::holds_listener(&table, &inodes, addr, sdp_port),
                        )),
                        // A daemon run as an unprivileged user (the systemd
                        // service) may not read other users' /proc/<pid>/fd.
                        // It still knows the caller's uid from SO_PEERCRED,
                        // and the socket table knows who created each
                        // listener: a user may register only its own.
                        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                            verified = "user";
                            Ok((
                                procnet::user_holds_listener(&table, uid, addr, port),
                                procnet::user_holds_listener(&table, uid, addr, sdp_port),
                            ))
                        }
                        Err(e) => Err(e),
                    }
                });
                match check {
                    Err(e) => refuse(self, &format!("cannot verify listeners: {e}")),
                    Ok((false, _)) => refuse(
                        self,
                        &format!("caller does not listen on {}", SocketAddr::new(addr, port)),
                    ),
                    Ok((_, false)) => refuse(
                        self,
                        &format!(
                            "caller does not listen on {}",
                            SocketAddr::new(addr, sdp_port)
                        ),
                    ),
                    Ok((true, true)) => match self.server.register(now, id, addr, port, sdp_port) {
                        Ok(()) => {
                            self.log.log(
                                Level::Info,
                                "registered",
                                &[
                                    ("addr", &addr),
                                    ("port", &port),
                                    ("sdp_port", &sdp_port),
                                    ("pid", &pid),
                                    ("uid", &uid),
                                    ("verified", &verified),
                                ],
                            );
                            "OK\n".into()
                        }
                        Err(RegisterError::Full) => refuse(self, "registration table full"),
                        Err(RegisterError::ZeroPort) => refuse(self, "port 0"),
                    },
                }
            }
            Request::Unregister { addr, port } => {
                if self.server.unregister(id, addr, port) {
                    self.log.log(
                        Level::Info,
                        "unregistered",
                        &[
                            ("addr", &addr),
                            ("port", &port),
                            ("pid", &pid),
                            ("reason", &"request"),
                        ],
                    );
                    "OK\n".into()
                } else {
                    "ERR not registered\n".into()
                }
            }
            Request::Connected { sdp_port, cp } => {
                if !self.server.owns_sdp_port(id, sdp_port) {
                    return "ERR not the owner of that SDP port\n".into();
                }
                self.server.handle_connection(sdp_port, cp.ip(), cp.port());
                "OK\n".into()
            }
            Request::List => {
                let queued: usize = self.conns.iter().map(|c| c.out.len() - c.out_pos).sum();
                if queued > MAX_TOTAL_CONTROL_OUTPUT {
                    return "ERR busy\n".into();
                }
                self.listing(now)
            }
        }
    }

    fn listing(&self, now: Instant) -> String {
        use std::fmt::Write as _;
        let owners: HashMap<u64, (i32, u32)> =
            self.conns.iter().map(|c| (c.id, (c.pid, c.uid))).collect();
        let mut out = String::new();
        for r in self.server.registrations() {
            let (pid, uid) = owners.get(&r.owner).copied().unwrap_or((0, 0));
            let _ = writeln!(
                out,
                "registration addr={} port={} sdp_port={} pid={pid} uid={uid} age_ms={}",
                r.addr,
                r.port,
                r.sdp_port,
                ms(now.saturating_duration_since(r.since))
            );
        }
        for p in self.server.pending() {
            let _ = writeln!(
                out,
                "pending handle={:#018x} cp={} ap={} sdp={} reply_to={} expires_in_ms={}",
                p.assoc_handle,
                SocketAddr::new(p.key.cp_addr, p.key.cp_port),
                SocketAddr::new(p.key.ap_addr, p.key.ap_port),
                SocketAddr::new(p.sdp_addr, p.sdp_port),
                p.reply_to,
                ms(p.expires.saturating_duration_since(now))
            );
        }
        let _ = writeln!(out, "stats {}", self.stats_fields());
        out.push_str("END\n");
        out
    }

    fn stats_fields(&self) -> String {
        let s = self.server.stats();
        format!(
            "rx={} accepts={} denies={} duplicates={} replaced={} acks={} connected={} expired={} evicted={} \
             stray_acks={} stray_replies={} rate_limited={} malformed={} malformed_truncated={} \
             malformed_too_long={} malformed_version={} malformed_ipv={} tx_errors={} \
             pending={} registrations={} sources={} control_conns={}",
            s.rx,
            s.accepts,
            s.denies,
            s.duplicates,
            s.replaced,
            s.acks,
            s.connected,
            s.expired,
            s.evicted,
            s.stray_acks,
            s.stray_replies,
            s.rate_limited,
            s.malformed(),
            s.malformed_truncated,
            s.malformed_too_long,
            s.malformed_version,
            s.malformed_ipv,
            self.tx_errors,
            self.server.pending_len(),
            self.server.registrations().count(),
            self.server.sources_len(),
            self.conns.len()
        )
    }

    fn log_stats(&self, level: Level, msg: &str) {
        let f = self.stats_fields();
        self.log.log(level, msg, &[("stats", &f)]);
    }

    fn periodic_stats(&mut self) {
        let s = *self.server.stats();
        if s == self.last_stats {
            return;
        }
        // §15.2.1: "track the rate of attack and raise an alarm to
        // management" — rate limiting, eviction and malformed floods are
        // warnings.
        let alarm = s.rate_limited > self.last_stats.rate_limited
            || s.evicted > self.last_stats.evicted
            || s.malformed() > self.last_stats.malformed();
        self.last_stats = s;
        self.log_stats(if alarm { Level::Warn } else { Level::Info }, "stats");
    }
}
