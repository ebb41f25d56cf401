//! A deterministic two-link harness over the real iWARP engine (STYLE
//! habit 5): two [`Link`]s, each with its own [`Connection`], and the MPA
//! byte stream between them cut into seeded random chunks (down to one
//! byte), with virtual time. Received bytes go through the engine's direct
//! placement path ([`Connection::recv_target`] / [`Connection::placed`])
//! exactly as a socket driver would use it.
//!
//! Every Op is checked against §10.5 as it is issued, and after every step
//! the credit accounting is checked on both sides ([`check_idle`]) along
//! with the §10 safety rule: a side's credit never exceeds the buffers the
//! peer has posted minus its messages the peer has not received.
//!
//! ```
//! use sdp_core::conn::Config;
//! use sdp_core::link::pair::LinkPair;
//!
//! let config = Config { bufs: 4, buf_size: 1024, ..Config::default() };
//! let mut pair = LinkPair::connected(&config, &config, 3);
//! pair.apps[0].to_write = 20_000;
//! pair.apps[1].to_write = 10_000;
//! assert!(pair.run(1_000_000, |p| p.apps[0].read == 10_000 && p.apps[1].read == 20_000));
//! assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use iwarp::engine::{Connection, Event as QpEvent, RecvTarget};
use iwarp::mem::Memory;

use super::{connection_config, AcceptError, Link};
use crate::conn::{Config, RecvFlags, SendFlags, Shutdown, State};
use crate::errno::Error;
use crate::testing::{check_idle, check_send, pattern, Rng, StreamHash};
use crate::verbs::{ErrorKind, Teardown};

/// One application on top of a link: writes a generated stream, reads and
/// checks the peer's.
#[derive(Debug, Clone)]
pub struct App {
    /// Seed of the stream it writes.
    pub seed: u64,
    /// Seed of the stream it reads.
    pub peer_seed: u64,
    /// Bytes to write in all.
    pub to_write: u64,
    /// Bytes accepted so far.
    pub written: u64,
    /// Hash of the bytes written.
    pub write_hash: StreamHash,
    /// Whether it reads.
    pub reading: bool,
    /// Bytes read.
    pub read: u64,
    /// Hash of the bytes read.
    pub read_hash: StreamHash,
    /// `recv` returned 0.
    pub eof: bool,
    /// Errors from `send`/`recv` other than EAGAIN.
    pub errors: Vec<Error>,
    /// A `send` failed with an error other than EAGAIN: like a real
    /// program, the application writes no more on its own ([`LinkPair::step`]
    /// no longer picks its writes; a direct [`LinkPair::app_write`] still
    /// calls `send`). Without this a socket that stays writable after
    /// EPIPE had the random steps call `send` until `max_steps`.
    pub write_failed: bool,
    /// The same for `recv`.
    pub read_failed: bool,
    /// shutdown(SHUT_WR) once everything is written.
    pub shutdown_when_done: bool,
    /// Largest single `send`/`recv`.
    pub max_io: usize,
    /// Writes with [`Link::send_direct`]: within the call the socket takes
    /// a random part straight from the buffer, the rest is staged.
    pub direct_send: bool,
    /// Waits in `read` while bytes arrive, with a buffer of random size
    /// lent to the link ([`Link::lend_recv`]) whenever nothing is unread;
    /// sometimes another thread pumps meanwhile, sometimes the read ends
    /// (a timeout) before its message is whole.
    pub direct_recv: bool,
    /// The buffer of a read waiting between two pumps.
    pub waiting: Option<Vec<u8>>,
    /// Waiting reads lend exactly `max_io` bytes.
    pub exact_reads: bool,
    /// Writes are of `max_io` bytes (but the last).
    pub exact_writes: bool,
}

impl App {
    fn new(seed: u64, peer_seed: u64) -> App {
        App {
            seed,
            peer_seed,
            to_write: 0,
            written: 0,
            write_hash: StreamHash::default(),
            reading: true,
            read: 0,
            read_hash: StreamHash::default(),
            eof: false,
            errors: Vec::new(),
            write_failed: false,
            read_failed: false,
            shutdown_when_done: false,
            max_io: 96 * 1024,
            direct_send: false,
            direct_recv: false,
            waiting: None,
            exact_reads: false,
            exact_writes: false,
        }
    }
}

/// One end: its link (the Accepting Peer's exists once the Hello was
/// accepted), its iWARP connection, and the bytes it put on the wire.
#[derive(Debug)]
pub struct Side {
    /// The link.
    pub link: Option<Link>,
    /// The iWARP connection.
    pub qp: Connection,
    /// Bytes written by this side, not yet received by the other.
    pub wire: VecDeque<u8>,
    /// This side's FIN follows the bytes on the wire.
    pub fin: bool,
    /// The FIN (or reset) reached the other side.
    pub fin_delivered: bool,
    /// This side's TCP connection is gone (reset sent or received).
    pub dead: bool,
    /// Not driven by the harness: a test plays this peer by hand.
    pub hostile: bool,
    /// The Accepting Peer refused the Hello.
    pub refused: Option<AcceptError>,
    /// LLP events delivered to this side: `Some(kind)` a reset, `None` a
    /// FIN.
    pub llp_events: Vec<Option<ErrorKind>>,
}

impl Side {
    /// The link.
    ///
    /// # Panics
    ///
    /// If there is none (an Accepting Peer before or after refusing).
    pub fn link(&mut self) -> &mut Link {
        self.link.as_mut().expect("no link")
    }
}

/// Moves the first `dst.len()` bytes of `wire` into `dst`.
fn take_into(wire: &mut VecDeque<u8>, dst: &mut [u8]) {
    let k = dst.len();
    let (a, b) = wire.as_slices();
    let first = k.min(a.len());
    dst[..first].copy_from_slice(&a[..first]);
    dst[first..].copy_from_slice(&b[..k - first]);
    wire.drain(..k);
}

/// Two links over the real engine; see the module documentation.
pub struct LinkPair {
    /// 0 is the Connecting Peer (MPA initiator), 1 the Accepting Peer.
    pub sides: [Side; 2],
    /// The applications.
    pub apps: [App; 2],
    /// Virtual time.
    pub now: Instant,
    /// The interleaving and the chunking.
    pub rng: Rng,
    /// Largest chunk moved across the wire at once (chunks are random in
    /// 1..=max, and often tiny).
    pub max_chunk: usize,
    /// Whether one chunk in eight is tiny (1 to 16 bytes).
    pub tiny_chunks: bool,
    /// Ops checked against §10.5.
    pub ops_checked: u64,
    config_b: Config,
    buf: Vec<u8>,
    expect: Vec<u8>,
}

impl LinkPair {
    /// A Connecting Peer with `a` and an Accepting Peer with `b`, before
    /// any byte moved. `hello` replaces the Hello on the wire (for the
    /// accept/reject matrix).
    pub fn new(a: &Config, b: &Config, seed: u64, hello: Option<Vec<u8>>) -> LinkPair {
        let now = Instant::now();
        let mut client = Link::connect(a);
        let hello = hello.unwrap_or_else(|| client.hello().to_vec());
        let mut cq = Connection::connect(connection_config(a), &hello, now).expect("MPA Request");
        client.drive(now, &mut cq);
        let sq = Connection::listen(connection_config(b), now);
        let side = |link, qp| Side {
            link,
            qp,
            wire: VecDeque::new(),
            fin: false,
            fin_delivered: false,
            dead: false,
            hostile: false,
            refused: None,
            llp_events: Vec::new(),
        };
        LinkPair {
            sides: [side(Some(client), cq), side(None, sq)],
            apps: [
                App::new(seed ^ 0xa, seed ^ 0xb),
                App::new(seed ^ 0xb, seed ^ 0xa),
            ],
            now,
            rng: Rng::new(seed),
            max_chunk: 64 * 1024,
            tiny_chunks: true,
            ops_checked: 0,
            config_b: b.clone(),
            buf: Vec::new(),
            expect: Vec::new(),
        }
    }

    /// [`LinkPair::new`] run until both ends are connected.
    ///
    /// # Panics
    ///
    /// If setup does not finish.
    pub fn connected(a: &Config, b: &Config, seed: u64) -> LinkPair {
        let mut pair = LinkPair::new(a, b, seed, None);
        assert!(
            pair.run(100_000, LinkPair::both_connected),
            "setup did not finish"
        );
        pair
    }

    /// Both links are connected.
    pub fn both_connected(&self) -> bool {
        self.sides
            .iter()
            .all(|s| s.link.as_ref().is_some_and(Link::is_connected))
    }

    /// Drives side `s`'s link (or, for an Accepting Peer without one yet,
    /// waits for the MPA Request), then checks the credit rules.
    pub fn drive(&mut self, s: usize) {
        self.drive_lent(s, None);
    }

    /// [`LinkPair::drive`] with a waiting reader's buffer lent.
    fn drive_lent(&mut self, s: usize, recv_into: Option<&[u8]>) {
        let now = self.now;
        let side = &mut self.sides[s];
        if side.hostile {
            return;
        }
        if side.link.is_none() && side.refused.is_none() {
            while let Some(ev) = side.qp.poll_event() {
                if let QpEvent::ConnectRequest { private_data, .. } = ev {
                    match Link::accept(&self.config_b, &private_data, &mut side.qp, now) {
                        Ok(link) => side.link = Some(link),
                        Err(e) => side.refused = Some(e),
                    }
                    break;
                }
            }
        }
        let Some(link) = side.link.as_mut() else {
            return;
        };
        let mut checked = 0;
        link.drive_checked(
            now,
            &mut side.qp,
            &mut |before, op| {
                checked += 1;
                if let crate::verbs::Op::Send {
                    header, payload, ..
                } = op
                {
                    check_send(s, before, header, payload.end > payload.start);
                }
            },
            recv_into,
        );
        self.ops_checked += checked;
        self.after_drive(s);
    }

    /// Teardown and invariants after a drive.
    fn after_drive(&mut self, s: usize) {
        let o = 1 - s;
        let side = &mut self.sides[s];
        let Some(link) = side.link.as_ref() else {
            return;
        };
        match link.teardown() {
            // FIN once every posted Send is written.
            Some(Teardown::Graceful)
                if side.qp.txq().is_empty() && side.qp.datapath().send_outstanding() == 0 =>
            {
                side.fin = true;
            }
            Some(Teardown::Abortive) if !side.dead => {
                // A reset: what is in flight is lost, the peer sees ECONNRESET.
                side.dead = true;
                side.wire.clear();
                side.fin_delivered = true;
                self.sides[o].wire.clear();
                self.sides[o].fin_delivered = true;
                self.reset(o);
            }
            _ => {}
        }
        self.check(s);
    }

    fn reset(&mut self, s: usize) {
        let now = self.now;
        let side = &mut self.sides[s];
        if side.dead {
            return;
        }
        side.dead = true;
        side.llp_events.push(Some(ErrorKind::Reset));
        if let Some(link) = side.link.as_mut() {
            link.llp_failed(now, ErrorKind::Reset, &mut side.qp);
        } else {
            side.qp.handle_llp_closed(now);
        }
        self.drive(s);
    }

    /// The §10 rules between the two sides after a drive.
    fn check(&self, s: usize) {
        let side = &self.sides[s];
        let Some(link) = side.link.as_ref() else {
            return;
        };
        if side.hostile || side.dead {
            return;
        }
        let posted = side.qp.datapath().recv_posted() + link.recv_held();
        check_idle(s, link.conn(), posted);
        let peer = &self.sides[1 - s];
        let (Some(peer_link), false) = (peer.link.as_ref(), peer.hostile || peer.dead) else {
            return;
        };
        let (me, them) = (link.conn(), peer_link.conn());
        if me.state() != State::Connected || them.state() != State::Connected {
            return;
        }
        let mine = me.credit_state();
        let theirs = them.credit_state();
        if mine.lsseq == 0 {
            return;
        }
        let in_flight = i64::from(mine.lsseq.wrapping_sub(theirs.mseq_ack) as i32);
        let room = theirs.rq_posted as i64 - in_flight;
        assert!(
            mine.send_credit <= room,
            "side {s}: credit {} > room {room} ({mine:?} / {theirs:?})",
            mine.send_credit
        );
    }

    fn chunk(&mut self) -> usize {
        if self.tiny_chunks && self.rng.chance(1, 8) {
            1 + self.rng.below(16) as usize
        } else {
            1 + self.rng.below(self.max_chunk as u64) as usize
        }
    }

    /// Frames what side `s` has to send (the engine's budget) and reports
    /// whether its transmit queue holds anything.
    fn has_output(&mut self, s: usize) -> bool {
        let now = self.now;
        let side = &mut self.sides[s];
        if side.dead {
            return false;
        }
        if let Some(link) = side.link.as_mut() {
            side.qp.poll_transmit(now, &link.memory(), 256 * 1024);
        } else {
            side.qp
                .poll_transmit(now, &iwarp::mem::VecMemory::new(), 256 * 1024);
        }
        !side.qp.txq().is_empty()
    }

    /// Side `s` writes up to one chunk of its transmit queue to the wire.
    pub fn transmit(&mut self, s: usize) {
        let n = self.chunk();
        self.transmit_from(s, n, None);
        self.drive(s);
    }

    /// Side `s` frames what it has and writes up to `n` octets of it to the
    /// wire, with `lent` as the bytes of a direct send in progress; returns
    /// the octets written.
    pub fn transmit_from(&mut self, s: usize, n: usize, lent: Option<&[&[u8]]>) -> usize {
        let now = self.now;
        let side = &mut self.sides[s];
        if let (Some(link), Some(_)) = (side.link.as_mut(), lent) {
            side.qp
                .poll_transmit(now, &link.memory_with(lent, None), 256 * 1024);
        }
        let mut taken = 0;
        {
            let wire = &mut side.wire;
            let mut copy = |slice: &[u8]| {
                let k = slice.len().min(n - taken);
                wire.extend(&slice[..k]);
                taken += k;
                taken < n
            };
            let r = match side.link.as_mut() {
                Some(link) => side
                    .qp
                    .txq()
                    .for_each_slice(&link.memory_with(lent, None), &mut copy),
                None => side
                    .qp
                    .txq()
                    .for_each_slice(&iwarp::mem::VecMemory::new(), &mut copy),
            };
            r.expect("transmit queue refers to missing memory");
        }
        side.qp.tx_advance(now, taken);
        taken
    }

    /// Side `s`'s bytes on the wire: up to one chunk reaches the other
    /// side, through direct placement where the engine offers it.
    pub fn deliver(&mut self, s: usize) {
        let mut n = self.chunk().min(self.sides[s].wire.len());
        let now = self.now;
        let o = 1 - s;
        let mut lent = self.lend_reader(o);
        let [a, b] = &mut self.sides;
        let (from, to) = if s == 0 { (a, b) } else { (b, a) };
        while n > 0 {
            let target = to.qp.recv_target();
            let mut scratch = iwarp::mem::VecMemory::new();
            let mut lm = to
                .link
                .as_mut()
                .map(|l| l.memory_with(None, lent.as_deref_mut()));
            let mem: &mut dyn Memory = match lm.as_mut() {
                Some(m) => m,
                None => &mut scratch,
            };
            match target {
                RecvTarget::Place {
                    region,
                    offset,
                    len,
                } => {
                    let k = n.min(len);
                    let dst = mem
                        .region_mut(region)
                        .and_then(|r| r.get_mut(offset..offset + k))
                        .expect("placement outside memory");
                    take_into(&mut from.wire, dst);
                    to.qp.placed(now, k, mem);
                    n -= k;
                }
                RecvTarget::Scratch { max } => {
                    let k = n.min(max.max(1));
                    let mut bytes = vec![0; k];
                    let (a, b) = from.wire.as_slices();
                    let first = k.min(a.len());
                    bytes[..first].copy_from_slice(&a[..first]);
                    bytes[first..].copy_from_slice(&b[..k - first]);
                    let used = to.qp.handle_input(now, &bytes, mem);
                    from.wire.drain(..used.min(k));
                    n -= k;
                    if used < k {
                        // The startup waits for the ULP, or the stream left
                        // iWARP (MPA reject): the rest is not the engine's.
                        if to.qp.state() == iwarp::engine::State::Error {
                            from.wire.clear();
                        }
                        break;
                    }
                }
            }
        }
        self.drive_lent(o, lent.as_deref());
        if let Some(buf) = lent {
            self.reader_done(o, buf, false);
        }
        if self.sides[s].fin && self.sides[s].wire.is_empty() && !self.sides[s].fin_delivered {
            self.sides[s].fin_delivered = true;
            let to = &mut self.sides[o];
            to.llp_events.push(None);
            if let Some(link) = to.link.as_mut() {
                link.llp_closed(now, &mut to.qp);
            } else {
                to.qp.handle_llp_closed(now);
            }
            self.drive(o);
        }
    }

    /// A delivery to side `o` whose application reads directly: the
    /// reader's buffer if it pumps this delivery itself (lent), or `None`
    /// (not waiting, or another thread pumps).
    fn lend_reader(&mut self, o: usize) -> Option<Vec<u8>> {
        let app = &self.apps[o];
        if !app.direct_recv || !app.reading || app.eof || self.sides[o].hostile {
            return None;
        }
        if app.waiting.is_some() && self.rng.chance(1, 4) {
            // Another thread (the progress thread) pumps while the reader
            // waits.
            return None;
        }
        let len = if app.exact_reads {
            app.max_io
        } else {
            1 + self.rng.below(app.max_io as u64) as usize
        };
        let mut buf = self.apps[o].waiting.take().unwrap_or_else(|| vec![0; len]);
        let now = self.now;
        let side = &mut self.sides[o];
        let link = side.link.as_mut()?;
        if link.lend_recv(now, &mut side.qp, &mut buf) {
            return Some(buf);
        }
        self.reader_done(o, buf, false);
        None
    }

    /// After a pump for the waiting reader of side `o`: the bytes placed in
    /// `buf` are checked and counted as read, or the reader goes on
    /// waiting (unless `leave`, or at random: a timeout).
    fn reader_done(&mut self, o: usize, buf: Vec<u8>, leave: bool) {
        let now = self.now;
        let side = &mut self.sides[o];
        let Some(link) = side.link.as_mut() else {
            return;
        };
        // Every completion was handled, with its overlay.
        assert_eq!(side.qp.datapath().overlays_done(), 0, "side {o}");
        link.park_recv(&mut side.qp);
        let n = link.take_received_direct();
        if n > 0 {
            let app = &mut self.apps[o];
            self.expect.resize(n, 0);
            pattern(app.peer_seed, app.read, &mut self.expect);
            assert!(
                buf[..n] == self.expect[..],
                "side {o}: wrong bytes placed directly at offset {}",
                app.read
            );
            app.read_hash.update(&buf[..n]);
            app.read += n as u64;
        }
        if n == 0 && link.recv_lent() && !leave && !self.rng.chance(1, 3) {
            self.apps[o].waiting = Some(buf);
            return;
        }
        link.recv_done_waiting(now, &mut side.qp, &buf);
        // Emptied buffers are re-posted and credited.
        self.drive(o);
    }

    /// The waiting reader of side `o` wakes without new bytes and ends its
    /// read.
    pub fn reader_wakes(&mut self, o: usize) {
        let Some(mut buf) = self.apps[o].waiting.take() else {
            return;
        };
        let now = self.now;
        let side = &mut self.sides[o];
        if let Some(link) = side.link.as_mut() {
            link.drive(now, &mut side.qp);
            link.lend_recv(now, &mut side.qp, &mut buf);
        }
        self.reader_done(o, buf, true);
    }

    /// The application of side `s` writes once.
    pub fn app_write(&mut self, s: usize) {
        let app = &self.apps[s];
        let left = app.to_write - app.written;
        let Some(link) = self.sides[s].link.as_mut() else {
            return;
        };
        if left == 0 {
            if app.shutdown_when_done && link.is_connected() {
                let _ = link.shutdown(Shutdown::Write);
                self.apps[s].shutdown_when_done = false;
                self.drive(s);
            }
            return;
        }
        let want = if app.exact_writes {
            app.max_io as u64
        } else {
            1 + self.rng.below(app.max_io as u64)
        };
        let want = want.min(left) as usize;
        self.buf.resize(want, 0);
        pattern(app.seed, app.written, &mut self.buf);
        let Some(link) = self.sides[s].link.as_mut() else {
            return;
        };
        if self.apps[s].direct_send {
            let buf = core::mem::take(&mut self.buf);
            match link.send_direct(&[&buf], SendFlags::EMPTY) {
                Ok(n) => {
                    let app = &mut self.apps[s];
                    app.write_hash.update(&buf[..n]);
                    app.written += n as u64;
                    // The call posts and writes what the socket takes.
                    self.drive(s);
                    let k = self.chunk();
                    self.transmit_from(s, k, Some(&[&buf[..n]]));
                    let side = &mut self.sides[s];
                    if let Some(link) = side.link.as_mut() {
                        link.finish_direct(&[&buf[..n]], &mut side.qp);
                    }
                }
                Err(Error::WouldBlock) => {}
                Err(e) => {
                    self.apps[s].errors.push(e);
                    self.apps[s].write_failed = true;
                }
            }
            self.buf = buf;
            self.drive(s);
            return;
        }
        match link.send(&self.buf, SendFlags::EMPTY) {
            Ok(n) => {
                let app = &mut self.apps[s];
                app.write_hash.update(&self.buf[..n]);
                app.written += n as u64;
            }
            Err(Error::WouldBlock) => {}
            Err(e) => {
                self.apps[s].errors.push(e);
                self.apps[s].write_failed = true;
            }
        }
        self.drive(s);
    }

    /// The application of side `s` reads once and checks the bytes.
    pub fn app_read(&mut self, s: usize) {
        let want = 1 + self.rng.below(self.apps[s].max_io as u64) as usize;
        self.buf.resize(want, 0);
        let Some(link) = self.sides[s].link.as_mut() else {
            return;
        };
        match link.recv(&mut self.buf, RecvFlags::EMPTY) {
            Ok(0) => self.apps[s].eof = true,
            Ok(n) => {
                let app = &mut self.apps[s];
                self.expect.resize(n, 0);
                pattern(app.peer_seed, app.read, &mut self.expect);
                assert!(
                    self.buf[..n] == self.expect[..],
                    "side {s}: wrong bytes at offset {}",
                    app.read
                );
                app.read_hash.update(&self.buf[..n]);
                app.read += n as u64;
            }
            Err(Error::WouldBlock) => {}
            Err(e) => {
                self.apps[s].errors.push(e);
                self.apps[s].read_failed = true;
            }
        }
        self.drive(s);
    }

    /// One random step: a transmit, a delivery, an application call, or a
    /// jump of virtual time to the next timer. False if nothing can happen.
    pub fn step(&mut self) -> bool {
        self.now += Duration::from_micros(self.rng.below(20));
        let mut choices = [0usize; 10];
        let mut count = 0;
        for s in 0..2 {
            if self.has_output(s) {
                choices[count] = s;
                count += 1;
            }
            let side = &self.sides[s];
            if !side.wire.is_empty() || (side.fin && !side.fin_delivered) {
                choices[count] = 2 + s;
                count += 1;
            }
            let app = &self.apps[s];
            if let Some(link) = self.sides[s].link.as_ref() {
                if !self.sides[s].hostile {
                    if (app.written < app.to_write || app.shutdown_when_done)
                        && !app.write_failed
                        && link.writable()
                    {
                        choices[count] = 4 + s;
                        count += 1;
                    }
                    if app.reading && !app.eof && !app.read_failed && link.readable() {
                        choices[count] = 6 + s;
                        count += 1;
                    }
                    if app.waiting.is_some() {
                        choices[count] = 8 + s;
                        count += 1;
                    }
                }
            }
        }
        if count == 0 {
            return self.fire_timers();
        }
        let choice = choices[self.rng.below(count as u64) as usize];
        match choice {
            0 | 1 => self.transmit(choice),
            2 | 3 => self.deliver(choice - 2),
            4 | 5 => self.app_write(choice - 4),
            6 | 7 => self.app_read(choice - 6),
            _ => self.reader_wakes(choice - 8),
        }
        true
    }

    /// Jumps virtual time to the next timer and fires it; false if there is
    /// none.
    fn fire_timers(&mut self) -> bool {
        let next = self
            .sides
            .iter()
            .filter(|s| !s.dead && !s.hostile)
            .flat_map(|s| {
                [
                    s.link.as_ref().and_then(Link::poll_timeout),
                    s.qp.poll_timeout(),
                ]
            })
            .flatten()
            .min();
        let Some(at) = next else {
            return false;
        };
        self.now = self.now.max(at);
        let now = self.now;
        for s in 0..2 {
            let side = &mut self.sides[s];
            if side.dead || side.hostile {
                continue;
            }
            side.qp.handle_timeout(now);
            if let Some(link) = side.link.as_mut() {
                link.handle_timeout(now);
            }
            self.drive(s);
        }
        true
    }

    /// Steps until `done` holds (true), `max_steps` pass, or nothing can
    /// happen (false unless `done` holds then).
    pub fn run(&mut self, max_steps: u64, done: impl Fn(&LinkPair) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    /// Steps until nothing can happen; false if `max_steps` pass first.
    pub fn settle(&mut self, max_steps: u64) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        false
    }
}
