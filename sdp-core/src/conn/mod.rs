//! The SDP connection (draft-pinkerton-iwarp-sdp-01): a sans-IO state
//! machine that speaks verbs values ([`crate::verbs`]).
//!
//! Read first: draft §8 (setup and teardown), §9.1 (Bcopy), §9.5.3 (OOB),
//! §10 (Private Buffers and credits), §14.2 (solicited events).
//!
//! * [`setup`] — Hello/HelloAck (§8.1.1).
//! * [`credit`] — §10.2–§10.5 credit arithmetic.
//! * [`recv`] — the receive Private Buffer pool and received stream.
//! * [`send`] — the send stream and Data Message chunking.
//! * [`close`] — close reasons and protocol violations (§8.2).
//! * [`suspend`] — socket duplication as the Remote Peer (§13.1.1):
//!   SuspComm answered, then [`Conn::resume`] on a new LLP connection.
//!
//! # Driving a connection
//!
//! Inputs: [`Conn::handle_event`] (verbs completions and LLP events),
//! [`Conn::handle_timeout`], and the socket calls [`Conn::send`],
//! [`Conn::recv`], [`Conn::shutdown`], [`Conn::close`], [`Conn::abort`].
//! Outputs: [`Conn::poll_op`] (verbs operations) and [`Conn::poll_timeout`].
//! After every input the driver drains `poll_op` until it returns `None`
//! and re-arms its timer from `poll_timeout`; that is all it takes for
//! accepted bytes to leave, credits to be returned and closes to finish
//! while the application does nothing.
//!
//! Both half-connections are in Combined Mode after setup (§8.1.1 steps 6
//! and 7e) and stay there; this implementation sends Data Messages only
//! (Bcopy) and answers a SrcAvail with SendSm (§9.5.2.1).
//!
//! ```
//! use std::time::Instant;
//! use sdp_core::conn::{Config, Conn, RecvFlags, SendFlags, State};
//! use sdp_core::verbs::{Event, Op, WrId};
//!
//! let now = Instant::now();
//! let config = Config { bufs: 4, buf_size: 256, ..Config::default() };
//! let mut client = Conn::connect(&config);
//! // The adapter posts the receive buffers, then sends the Hello in the
//! // MPA Request's private data.
//! while let Some(op) = client.poll_op() {
//!     assert!(matches!(op, Op::PostRecv { .. }));
//! }
//! let mut server = Conn::accept(&config, client.hello().unwrap()).unwrap();
//! while server.poll_op().is_some() {}
//! // The initiator's RTR arrived: the HelloAck goes as Send with SE.
//! server.handle_event(now, Event::Established);
//! let Some(Op::Send { header, .. }) = server.poll_op() else { panic!() };
//! // The in-memory "wire": the HelloAck lands in the client's first buffer.
//! client.pool_mut().buffer_mut(0).unwrap()[..header.len()].copy_from_slice(&header);
//! client.handle_event(now, Event::RecvDone { wr_id: WrId(0), len: header.len() });
//! assert_eq!(client.state(), State::Connected);
//! assert_eq!(client.send(5, SendFlags::EMPTY), Ok(5));
//! ```

pub mod close;
pub mod credit;
pub mod recv;
pub mod send;
pub mod setup;
pub mod suspend;
#[cfg(test)]
mod tests;
pub mod zcopy;
#[cfg(test)]
mod zcopy_script_tests;
#[cfg(test)]
mod zcopy_tests;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub use close::{CloseReason, Violation};
use close::{Ending, Llp, Reading};
pub use recv::BufferPool;
pub use setup::{Config, Pipelining};
pub use zcopy::{Completion, ZcopyState, ZcopyStats};

use credit::{Credits, CONTROL_MIN_CREDIT, PAYLOAD_MIN_CREDIT};
use recv::RxStream;
use send::{Chunk, Hold, TxStream, OOB_PEND_REACH};
use setup::PeerParams;
use suspend::{LocalSuspend, Suspend};

use crate::errno::Error;
use crate::verbs::{
    ErrorKind, Event, Op, RdmaOp, SendHeader, SendKind, Teardown, Work, WrId, MAX_HEADER_LEN,
};
use crate::wire::{
    self, Body, Bsdh, BsdhRepr, ChRcvBufAckRepr, ChRcvBufRepr, Flags, MessageRepr, Mid,
    HELLO_MSG_LEN,
};

/// Which end of the connection setup this is (§5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sent the connection request and the Hello.
    Connecting,
    /// Answered with the HelloAck.
    Accepting,
}

/// Where the connection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Connecting Peer: the Hello went in the MPA Request; waiting for the
    /// HelloAck (§8.1.1 steps 1–2, 7).
    HelloSent,
    /// Accepting Peer: the Hello was accepted; the HelloAck goes once the
    /// iWARP connection is up (§8.1.1 steps 3–5).
    HelloReceived,
    /// Both half-connections carry data (§8.1.1 steps 6, 7e), possibly
    /// half-closed.
    Connected,
    /// The LLP teardown was requested; only reading what was received
    /// remains.
    Closed,
}

/// The Flow Control Mode of a half-connection (§11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlowControlMode {
    /// Bcopy only (§11.1).
    Buffered,
    /// Bcopy and Read Zcopy (§11.2).
    Combined,
    /// Every mechanism (§11.3).
    Pipelined,
}

/// Which half-connection `shutdown` closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Shutdown {
    /// SHUT_RD.
    Read,
    /// SHUT_WR: DisConn once the data is out (§8.2.1).
    Write,
    /// SHUT_RDWR.
    Both,
}

/// `send` flags, with the Linux `MSG_*` values so raw flags convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// No flag.
    pub const EMPTY: SendFlags = SendFlags(0);
    /// MSG_OOB: the last byte accepted is urgent (§9.5.3).
    pub const OOB: SendFlags = SendFlags(0x1);
    /// More follows at once (`MSG_MORE`): the buffer is not lent.
    pub const MORE: SendFlags = SendFlags(0x8000);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: SendFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

/// `recv` flags, with the Linux `MSG_*` values so raw flags convert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RecvFlags(pub u32);

impl RecvFlags {
    /// No flag.
    pub const EMPTY: RecvFlags = RecvFlags(0);
    /// MSG_OOB: read the urgent byte out of line.
    pub const OOB: RecvFlags = RecvFlags(0x1);
    /// MSG_PEEK: copy without consuming.
    pub const PEEK: RecvFlags = RecvFlags(0x2);
    /// MSG_WAITALL: see [`Conn::recv`].
    pub const WAITALL: RecvFlags = RecvFlags(0x100);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: RecvFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl core::ops::BitOr for RecvFlags {
    type Output = RecvFlags;
    fn bitor(self, rhs: RecvFlags) -> RecvFlags {
        RecvFlags(self.0 | rhs.0)
    }
}

/// A snapshot of the credit state (§10), for observability and for tests
/// asserting the §10.5 rules after every step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreditState {
    /// Our send credit (§10.2).
    pub send_credit: i64,
    /// The peer's send credit as our last message set it, less what it
    /// sent since.
    pub remote_credit: i64,
    /// Buffers posted since our last message: positive means the next
    /// message provides additional credit.
    pub gain: i64,
    /// §10.5 requires a credit update now (never once the peer's DisConn
    /// arrived and it owes us no answer: see [`Conn::credit_updates_due`]).
    pub must_update: bool,
    /// The Bufs our next message carries: posted minus received (§6.1.3).
    pub bufs: u16,
    /// Buffers on the receive queue (PostRecv returned, RecvDone not yet).
    pub rq_posted: usize,
    /// MSeq of our last message (LSSeq).
    pub lsseq: u32,
    /// MSeq of the last message received.
    pub mseq_ack: u32,
    /// Bufs of the last message received.
    pub peer_bufs: u16,
    /// MSeqAck of the last message received.
    pub peer_mseq_ack: u32,
}

/// How a buffer goes back on the receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PostKind {
    /// Posted at setup, already counted in the Hello's or HelloAck's Bufs.
    Initial,
    /// Re-posted after its message was consumed.
    Fresh,
    /// Re-posted after holding a pure credit update.
    Pure,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AbortConn {
    None,
    /// To be sent next (§8.2.2).
    Pending,
    /// Sent; the LLP teardown follows its completion.
    Sent,
}

/// Control messages waiting for credit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Control {
    /// For the oldest incomplete SrcAvail; `cancel`: answering the
    /// SrcAvailCancel of that MSeq (§9.5.4).
    SendSm {
        cancel: Option<u32>,
    },
    ChRcvBufAck,
    RdmaRdCompl {
        len: u32,
        invalidate: Option<u32>,
    },
    RdmaWrCompl {
        len: u32,
        stag: u32,
    },
    SinkCancelAck,
    SrcAvailCancel,
    SinkAvailCancel,
    ModeChange {
        send: bool,
        mode: FlowControlMode,
    },
    ChRcvBuf {
        size: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Other,
    DisConn,
    AbortConn,
    /// Our SuspCommAck (§13.1.1 step 4 waits for its completion).
    SuspCommAck,
    /// An RDMA Write (completes as WriteDone).
    Write,
    /// An RDMA Read Request (completes as ReadDone).
    Read,
}

impl Sent {
    /// The completion a work request of this kind reports.
    fn completes_as(self) -> Sent {
        match self {
            Sent::Write | Sent::Read => self,
            _ => Sent::Other,
        }
    }
}

/// Our ChRcvBuf (§10.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Resize {
    /// Size asked for, unacknowledged.
    asked: Option<u32>,
    /// A smaller size in use at once (§10.6: "MUST begin using the smaller
    /// size immediately after sending").
    smaller: Option<u32>,
    no_more_increase: bool,
    no_more_decrease: bool,
}

/// A Send posted and not completed.
#[derive(Debug, Clone, Copy)]
struct SendRecord {
    wr_id: u64,
    stream_end: u64,
    what: Sent,
}

/// Send work request ids carry this bit; receive ids are buffer indices.
const SEND_WR_BIT: u64 = 1 << 63;
/// The first wait before a credit request goes again after one that
/// brought no credit for payload ([`Conn::on_credit`]).
const ASK_GAP_MIN: Duration = Duration::from_millis(1);
/// The longest such wait; after it, requests stop until credit for
/// payload comes.
const ASK_GAP_MAX: Duration = Duration::from_millis(64);

/// A received message, parsed and copied out of its buffer.
#[derive(Debug, Clone)]
struct Received {
    bufs: u16,
    flags: Flags,
    mseq: u32,
    mseq_ack: u32,
    mid: Mid,
    /// Payload bytes inside the buffer.
    payload: core::ops::Range<usize>,
    /// Last payload byte (the OOB byte with OOB_PRES).
    last: u8,
    /// HelloAck parameters, when this is the expected HelloAck.
    hello_ack: Option<PeerParams>,
    /// The Len of an RdmaRdCompl or RdmaWrCompl, the ActSz of a
    /// ChRcvBufAck.
    compl_len: u32,
    sink_avail: Option<wire::SinkAvailRepr>,
    src_avail: Option<wire::SrcAvailRepr>,
    mode_change: Option<wire::ModeChangeRepr>,
    /// The Destination TCP Port of a SuspComm (§6.5.1.1).
    susp_port: Option<u16>,
}

/// `a` is at or after `b` in 32-bit sequence space.
fn seq_ge(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) < 1 << 31
}

/// One SDP connection; see the module documentation.
#[derive(Debug)]
pub struct Conn {
    role: Role,
    config: Config,
    state: State,
    pool: BufferPool,
    /// Buffers on the receive queue, in posting order.
    posted: VecDeque<usize>,
    /// Buffers to post.
    to_post: VecDeque<(usize, PostKind)>,
    credits: Credits,
    peer: Option<PeerParams>,
    ird: u16,
    ord: u16,
    minor: u8,
    hello: Option<[u8; HELLO_MSG_LEN]>,
    hello_ack_due: bool,
    tx: TxStream,
    next_send_id: u64,
    sends: VecDeque<SendRecord>,
    control: VecDeque<Control>,
    /// A credit request (a no-payload message at credit 2) is out.
    asked: bool,
    /// When a new credit request may go although the last one brought no
    /// credit for payload (see [`Conn::on_credit`]).
    ask_again: Option<Instant>,
    /// The wait before that, doubling while requests bring nothing.
    ask_gap: Duration,
    /// Sends take only what credits carry ([`Conn::set_credit_bound`]).
    credit_bound: bool,
    /// The last credit-bound send was refused bytes for lack of credit: a
    /// credit request may go as if bytes waited.
    credit_wanted: bool,
    /// The last send offered at least a message's worth of bytes: the
    /// credit bound applies to it and to writability (see
    /// [`Conn::send_room`]).
    large_writes: bool,
    /// TCP_NODELAY: no tail waits for the next write
    /// ([`Conn::set_nodelay`]).
    nodelay: bool,
    /// Whether the short tail of the last write waits for the next one.
    hold: Hold,
    rx: RxStream,
    /// Stream offsets at which OOB_PEND notices arrived, oldest first.
    oob_pend: VecDeque<u64>,
    urgent_notice: bool,
    z: zcopy::Zcopy,
    rdma_out: VecDeque<RdmaOp>,
    resize: Resize,
    /// The application's reading half.
    reading: Reading,
    /// Our half of the close (§8.2.1).
    ending: Ending,
    /// The MSeqAck of the peer's DisConn, once received.
    peer_disconn: Option<u32>,
    abort_conn: AbortConn,
    llp: Llp,
    reason: Option<CloseReason>,
    error: Option<Error>,
    deadline: Option<Instant>,
    freed: Vec<usize>,
    /// Socket duplication as the Remote Peer (§13.1.1 steps 3–4).
    suspend: Suspend,
    /// A resumed connection waiting for the HelloAck on its new LLP
    /// connection (§13.1.1 steps 4, 8).
    resuming: bool,
    /// The Local Peer's side, for tests only (see [`suspend`]).
    local_suspend: LocalSuspend,
}

impl Conn {
    fn new(role: Role, config: Config, credits: Credits, state: State) -> Conn {
        let count = usize::from(config.bufs);
        let pool = BufferPool::new(count, config.buf_size as usize);
        Conn::with_pool(role, config, credits, state, pool)
    }

    /// A connection whose receive buffers are `pool`, the first
    /// `config.bufs` of them to be posted.
    fn with_pool(
        role: Role,
        config: Config,
        credits: Credits,
        state: State,
        pool: BufferPool,
    ) -> Conn {
        let count = usize::from(config.bufs);
        Conn {
            role,
            ird: config.ird,
            ord: config.ord,
            config,
            state,
            pool,
            posted: VecDeque::with_capacity(count),
            to_post: (0..count).map(|i| (i, PostKind::Initial)).collect(),
            credits,
            peer: None,
            minor: wire::MINOR_VERSION,
            hello: None,
            hello_ack_due: false,
            tx: TxStream::default(),
            next_send_id: 0,
            sends: VecDeque::new(),
            control: VecDeque::new(),
            asked: false,
            ask_again: None,
            ask_gap: Duration::ZERO,
            credit_bound: false,
            credit_wanted: false,
            large_writes: false,
            nodelay: false,
            hold: Hold::default(),
            rx: RxStream::default(),
            oob_pend: VecDeque::new(),
            urgent_notice: false,
            z: zcopy::Zcopy::default(),
            rdma_out: VecDeque::new(),
            resize: Resize::default(),
            reading: Reading::Open,
            ending: Ending::Open,
            peer_disconn: None,
            abort_conn: AbortConn::None,
            llp: Llp::Up,
            reason: None,
            error: None,
            deadline: None,
            freed: Vec::new(),
            suspend: Suspend::None,
            resuming: false,
            local_suspend: LocalSuspend::None,
        }
    }

    /// A Connecting Peer (§8.1.1 steps 1–2). The first Ops are the
    /// PostRecvs of every receive buffer; once they are posted, the
    /// adapter sends [`Conn::hello`] as the MPA Request's private data.
    /// `config` is [normalized](Config::normalized).
    pub fn connect(config: &Config) -> Conn {
        let config = config.normalized();
        let hello = setup::hello_message(&config);
        let credits = Credits::connecting(config.bufs);
        let mut conn = Conn::new(Role::Connecting, config, credits, State::HelloSent);
        conn.hello = Some(hello);
        conn
    }

    /// An Accepting Peer for the Hello `hello` (the SDP bytes of the MPA
    /// Request's private data), §8.1.1 steps 3–4. On `Err` the caller
    /// rejects the MPA connection. On `Ok` the adapter posts the receive
    /// buffers (the first Ops), answers the MPA Request with
    /// [`Conn::ird`]/[`Conn::ord`], and reports [`Event::Established`] when
    /// the initiator's RTR arrived; the HelloAck follows.
    pub fn accept(config: &Config, hello: &[u8]) -> Result<Conn, Violation> {
        let config = config.normalized();
        let peer = setup::check_hello(hello)?;
        let (ird, ord) = setup::adjust_ird_ord(&config, &peer);
        let credits = Credits::accepting(peer.bufs, config.bufs);
        let mut conn = Conn::new(Role::Accepting, config, credits, State::HelloReceived);
        conn.peer = Some(peer);
        conn.ird = ird;
        conn.ord = ord;
        conn.minor = setup::minor_version(&peer);
        Ok(conn)
    }

    /// The Hello Message to send in Streaming Mode (Connecting Peer only).
    pub fn hello(&self) -> Option<&[u8]> {
        self.hello.as_ref().map(|h| &h[..])
    }

    /// Which end of the setup this is.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Where the connection stands.
    pub fn state(&self) -> State {
        self.state
    }

    /// The Flow Control Mode of our sending half-connection (§11; Combined
    /// after setup, §8.1.1).
    pub fn send_mode(&self) -> FlowControlMode {
        self.zsend_mode()
    }

    /// The Flow Control Mode of our receiving half-connection.
    pub fn recv_mode(&self) -> FlowControlMode {
        self.zrecv_mode()
    }

    /// The IRD to use on the queue pair, after the §8.1.1 adjustment.
    pub fn ird(&self) -> u16 {
        self.ird
    }

    /// The ORD to use on the queue pair, after the §8.1.1 adjustment.
    pub fn ord(&self) -> u16 {
        self.ord
    }

    /// The minor protocol version in use (§8.1.1 steps 3b, 7b).
    pub fn minor_version(&self) -> u8 {
        self.minor
    }

    /// The size of the peer's receive Private Buffers, once known: the
    /// largest message we send.
    pub fn peer_buf_size(&self) -> Option<u32> {
        self.peer.map(|p| p.rcv_size)
    }

    /// The configuration in use (normalized).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The receive Private Buffers.
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// The receive Private Buffers, for the adapter to place received
    /// messages into.
    pub fn pool_mut(&mut self) -> &mut BufferPool {
        &mut self.pool
    }

    /// The send stream: which offsets are accepted, sent and released.
    pub fn tx(&self) -> &TxStream {
        &self.tx
    }

    /// Why the connection closed, once it did.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.reason.as_ref()
    }

    /// The pending connection error, taken (SO_ERROR): what the next
    /// `send` or `recv` would have reported once.
    pub fn take_error(&mut self) -> Option<Error> {
        self.error.take()
    }

    /// A call that moved bytes before it met the pending error returns
    /// the bytes; the error stays pending for the next call, as a TCP
    /// socket's does (Linux keeps `sk_err` when a partial send or receive
    /// returns its count).
    pub fn restore_error(&mut self, e: Error) {
        self.error.get_or_insert(e);
    }

    /// Whether a connection error is pending (POLLERR; what
    /// [`Conn::take_error`] would return).
    pub fn error_pending(&self) -> bool {
        self.error.is_some()
    }

    /// Payload bytes received so far (the receive stream's length, read or
    /// not).
    pub fn rx_total(&self) -> u64 {
        self.rx.total()
    }

    /// Whether the LLP teardown Op went out: the adapter may drop the
    /// connection once the application is done with it.
    pub fn is_closed(&self) -> bool {
        self.llp == Llp::Down
    }

    /// Whether our DisConn went out.
    pub fn disconn_sent(&self) -> bool {
        self.ending.disconn_sent()
    }

    /// Whether an abortive close is sending its AbortConn (§8.2.2).
    pub fn is_aborting(&self) -> bool {
        self.abort_conn != AbortConn::None
    }

    /// Whether the peer's DisConn arrived (end of the received stream).
    pub fn disconn_received(&self) -> bool {
        self.peer_disconn.is_some()
    }

    /// Whether credit updates (§10.4, §10.5) still serve a purpose. Credit
    /// lets the peer send; after its DisConn it sends no more ULP data
    /// (§8.2.1), only answers to our messages, and those messages carry
    /// credit themselves. So once the peer's DisConn arrived, an update
    /// goes only while the peer owes us an answer it may lack the credit
    /// for (RdmaRdCompl or SendSm for our SrcAvail, ChRcvBufAck). Anything
    /// more could reach a peer that already closed its socket, as a TCP
    /// peer may after reading the end of our stream, and be answered with
    /// a reset that loses what we have not read yet.
    pub fn credit_updates_due(&self) -> bool {
        self.peer_disconn.is_none()
            || (!self.ending.disconn_sent()
                && (!self.z.srcs.is_empty() || self.resize.asked.is_some()))
    }

    /// Our send credit and the peer's, as [`Conn::credit_state`] has them
    /// (without the rest of it).
    pub fn credits(&self) -> (i64, i64) {
        (self.credits.send_credit(), self.credits.remote_credit())
    }

    /// The credit state, see [`CreditState`].
    pub fn credit_state(&self) -> CreditState {
        CreditState {
            send_credit: self.credits.send_credit(),
            remote_credit: self.credits.remote_credit(),
            gain: self.credits.gain(),
            must_update: self.credits.must_update() && self.credit_updates_due(),
            bufs: self.credits.bufs(),
            rq_posted: self.posted.len(),
            lsseq: self.credits.lsseq(),
            mseq_ack: self.credits.mseq_ack(),
            peer_bufs: self.credits.peer_bufs(),
            peer_mseq_ack: self.credits.peer_mseq_ack(),
        }
    }

    // ----- outputs -----------------------------------------------------

    /// The next Bcopy verbs operation, for an adapter without Zcopy
    /// support: with the default [`Config`] (Bcopy Threshold infinite, no
    /// Read or Write Zcopy, no Pipelining) the connection never needs an
    /// [`RdmaOp`]. Should one come up anyway, the connection is aborted.
    pub fn poll_op(&mut self) -> Option<Op> {
        loop {
            match self.poll_work()? {
                Work::Op(op) => return Some(op),
                Work::Rdma(_) => {
                    self.rdma_out.clear();
                    self.abort_with(CloseReason::LocalAbort, Some(Error::ConnectionReset));
                }
            }
        }
    }

    /// The next verbs operation or RDMA operation, or `None` when there is
    /// nothing to do until the next input. Without the time nothing waits
    /// for a later write ([`Conn::poll_work_at`]).
    pub fn poll_work(&mut self) -> Option<Work> {
        self.work(None)
    }

    /// [`Conn::poll_work`] at `now`: the short tail of a large write may
    /// wait for the next write ([`Config::coalesce`]).
    pub fn poll_work_at(&mut self, now: Instant) -> Option<Work> {
        self.work(Some(now))
    }

    fn work(&mut self, now: Option<Instant>) -> Option<Work> {
        if let Some(now) = now {
            self.hold.tick(now, self.config.coalesce);
        }
        match self.llp {
            Llp::Down => return None,
            Llp::Due(t) => {
                self.llp = Llp::Down;
                return Some(Work::Op(Op::Teardown(t)));
            }
            Llp::Up => {}
        }
        if let Some((buf, kind)) = self.to_post.pop_front() {
            match kind {
                PostKind::Initial => {}
                PostKind::Fresh => self.credits.on_post(true),
                PostKind::Pure => self.credits.on_post(false),
            }
            self.posted.push_back(buf);
            return Some(Work::Op(Op::PostRecv {
                wr_id: WrId(buf as u64),
                buf,
            }));
        }
        if self.state != State::Connected {
            return None;
        }
        if self.abort_conn == AbortConn::None {
            self.source_progress();
            // The next posted buffer's SinkAvail once the last one went.
            self.advertise_sinks();
            if let Some(op) = self.rdma_out.pop_front() {
                return Some(Work::Rdma(op));
            }
        }
        self.next_message(now)
    }

    /// When [`Conn::handle_timeout`] wants to be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.deadline,
            self.zcopy_deadline(),
            self.hold.deadline(),
            self.ask_again,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The next SDP Message to send, if §10.5 allows one.
    fn next_message(&mut self, now: Option<Instant>) -> Option<Work> {
        let credit = self.credits.send_credit();
        let gain = self.credits.gain();
        // §10.5: "If one credit is available, an implementation MUST only
        // send SDP Messages that provide additional credits and do not
        // contain ULP payload."
        let control_ok = credit >= CONTROL_MIN_CREDIT || (credit >= 1 && gain > 0);
        match self.abort_conn {
            AbortConn::Pending if control_ok => {
                self.abort_conn = AbortConn::Sent;
                return Some(Work::Op(self.emit(
                    Body::AbortConn,
                    Flags::EMPTY,
                    Sent::AbortConn,
                )));
            }
            AbortConn::Pending => {
                // No credit for the AbortConn: the LLP reset says the same.
                self.finish(Teardown::Abortive);
                return self.work(now);
            }
            AbortConn::Sent => return None,
            AbortConn::None => {}
        }
        if let Some(op) = self.suspend_gate(control_ok) {
            return op.map(Work::Op);
        }
        // §8.2.1: once our DisConn went and the peer's arrived, both
        // halves are closed and the peer may already have closed the LLP
        // (its kernel would answer anything more with a reset, losing
        // what we have not read yet). Nothing more is sent but an
        // AbortConn.
        if self.peer_disconn.is_some() && self.ending.disconn_sent() {
            return None;
        }
        // §10.5: "If no credits are available, an implementation MUST NOT
        // send any type of SDP Message."
        if credit <= 0 {
            return None;
        }
        if self.hello_ack_due {
            // §8.1.1 step 5: "Send the HelloAck Message using the iWARP
            // Send with SE Message." The credit is the Hello's Bufs, ≥ 3.
            self.hello_ack_due = false;
            let hah = setup::hello_ack_repr(&self.config, self.ird, self.ord);
            return Some(Work::Op(self.emit(
                Body::HelloAck(hah),
                Flags::EMPTY,
                Sent::Other,
            )));
        }
        if let Some(&control) = self.control.front() {
            if !control_ok {
                return None;
            }
            self.control.pop_front();
            let op = match control {
                Control::SendSm { cancel } => {
                    if cancel.is_some() {
                        // §9.5.4: the SendSm completing a cancel is the
                        // first message whose MSeqAck reaches the
                        // SrcAvailCancel's MSeq — that is how the Data
                        // Source tells it from an earlier SendSm.
                        self.credits.hold_ack(None);
                    }
                    let op = self.emit(Body::SendSm, Flags::EMPTY, Sent::Other);
                    let mseq = self.credits.lsseq();
                    self.on_send_sm_sent(mseq, cancel);
                    op
                }
                Control::RdmaRdCompl { len, invalidate } => {
                    let flags = self.req_pipe_flag();
                    let mut op = self.emit(Conn::rd_compl(len), flags, Sent::Other);
                    if let Op::Send { kind, .. } = &mut op {
                        *kind = Conn::compl_kind(invalidate);
                    }
                    op
                }
                Control::RdmaWrCompl { len, stag } => {
                    // §9.3: "The Data Source SHOULD send the RdmaWrCompl
                    // Message using Send with SE and Invalidate".
                    let flags = self.req_pipe_flag();
                    let mut op = self.emit(Conn::wr_compl(len), flags, Sent::Other);
                    if let Op::Send { kind, .. } = &mut op {
                        *kind = Conn::compl_kind(Some(stag));
                    }
                    op
                }
                Control::SinkCancelAck => self.emit(Body::SinkCancelAck, Flags::EMPTY, Sent::Other),
                Control::SrcAvailCancel => {
                    let op = self.emit(Body::SrcAvailCancel, Flags::EMPTY, Sent::Other);
                    self.credits.peer_may_hold(self.credits.lsseq());
                    if self.z.src_cancel.is_some() {
                        self.z.src_cancel = Some(Some(self.credits.lsseq()));
                    }
                    op
                }
                Control::SinkAvailCancel => {
                    self.emit(Body::SinkAvailCancel, Flags::EMPTY, Sent::Other)
                }
                Control::ModeChange { send, mode } => {
                    let op = self.emit(
                        Conn::mode_change_body(send, mode),
                        Flags::EMPTY,
                        Sent::Other,
                    );
                    let mseq = self.credits.lsseq();
                    self.on_mode_change_sent(mseq, send, mode);
                    op
                }
                Control::ChRcvBuf { size } => {
                    let crbh = ChRcvBufRepr { des_sz: size };
                    self.emit(Body::ChRcvBuf(crbh), Flags::EMPTY, Sent::Other)
                }
                Control::ChRcvBufAck => {
                    // §10.6: "If the Remote Peer is unable to resize its
                    // receive Private Buffers, it MUST specify in the
                    // ChRcvBufAck Message the original receive Private
                    // Buffer size."
                    let crbah = ChRcvBufAckRepr {
                        act_sz: self.config.buf_size,
                    };
                    self.emit(Body::ChRcvBufAck(crbah), Flags::EMPTY, Sent::Other)
                }
            };
            return Some(Work::Op(op));
        }
        if let Some(w) = self.next_src_avail(credit, control_ok) {
            return Some(w);
        }
        if let Some(w) = self.next_sink_avail(credit, control_ok) {
            return Some(w);
        }
        // §10.5: "If two credits are available, an implementation MUST only
        // send SDP Messages that do not contain ULP payload."
        if credit >= PAYLOAD_MIN_CREDIT {
            let limit = self.bcopy_limit();
            if let Some(chunk) = self.tx.next_chunk_until(self.max_payload(), limit) {
                if !self.holds(&chunk, now) {
                    return Some(Work::Op(self.emit_data(chunk)));
                }
            }
        }
        // §8.2.1 steps 1–2: DisConn after all data posted before the close.
        if self.ending == Ending::Shut
            && self.tx.unsent() == 0
            && self.z.srcs.is_empty()
            && self.z.writing.is_none()
        {
            if !control_ok {
                return None;
            }
            let after_peer = self.peer_disconn.is_some();
            let op = self.emit(Body::DisConn, Flags::EMPTY, Sent::DisConn);
            self.ending = Ending::DisConn {
                mseq: self.credits.lsseq(),
                after_peer,
                done: false,
            };
            return Some(Work::Op(op));
        }
        // §9.5.3: "It is RECOMMENDED that this notification be accomplished
        // in an expeditious fashion"; "an implementation MAY send an SDP
        // Message with the OOB_PEND flag using a reserved credit".
        if control_ok && self.tx.pend_due() {
            self.tx.on_pend_sent();
            return Some(Work::Op(self.emit(
                Body::Data { payload: &[] },
                Flags::OOB_PEND,
                Sent::Other,
            )));
        }
        // §10.4: gratuitous credit update.
        if self.credits.should_update(self.config.bufs) && self.credit_updates_due() {
            return Some(Work::Op(self.emit(
                Body::Data { payload: &[] },
                Flags::EMPTY,
                Sent::Other,
            )));
        }
        // Two credits and data waiting: the peer may have buffers it has
        // not told us about but cannot see that we are stuck. One empty
        // Data Message (allowed with two credits) lowers our credit as the
        // peer sees it and so triggers its update.
        if credit == CONTROL_MIN_CREDIT
            && !self.asked
            && (self.tx.unsent() > 0 || self.credit_wanted)
        {
            self.asked = true;
            return Some(Work::Op(self.emit(
                Body::Data { payload: &[] },
                Flags::EMPTY,
                Sent::Other,
            )));
        }
        None
    }

    /// Whether `chunk` waits for the next write to fill its message
    /// ([`Hold`]): the short tail of a stream of large writes, while no
    /// reader of ours waits for the peer, no urgent byte, close, lent
    /// buffer or socket duplication needs it in a Send, and the program
    /// did not set TCP_NODELAY.
    fn holds(&mut self, chunk: &Chunk, now: Option<Instant>) -> bool {
        let Some(now) = now else {
            return false;
        };
        let short = chunk.range.end - chunk.range.start < self.max_payload();
        let tail = chunk.range.end == self.tx.accepted() && chunk.flags.is_empty();
        short
            && tail
            && !self.nodelay
            && self.ending == Ending::Open
            && !self.config.coalesce.is_zero()
            && !self.zsend_pending()
            && self.local_suspend == LocalSuspend::None
            && self.hold.holds(now, self.config.coalesce)
    }

    /// Bytes wait to be sent that only credit holds back (not a short tail
    /// waiting for the next write, [`Conn::holds`]).
    pub fn waits_for_credit(&self) -> bool {
        let unsent = self.tx.unsent();
        unsent > 0 && !(self.hold.holding() && unsent < self.max_payload())
    }

    /// New send credit came. Enough for payload: a credit request may go
    /// again whenever we are stuck. Less: the peer's message may have
    /// lifted its view of our credit above one, where §10.5 no longer
    /// makes it send the buffer its application frees next (this
    /// implementation sends it anyway, [`Credits::should_update`], another
    /// may not), so the request goes again — but not at once: two peers
    /// stuck at two credits each, their applications holding every other
    /// buffer, would answer each other's requests for ever, each request
    /// giving back the buffer of the one before. It waits 1 ms, doubling
    /// while requests bring nothing more, and after 64 ms gives up until
    /// credit for payload comes.
    fn on_credit(&mut self, now: Instant) {
        if self.credits.send_credit() >= PAYLOAD_MIN_CREDIT {
            self.asked = false;
            self.ask_again = None;
            self.ask_gap = Duration::ZERO;
        } else if self.asked && self.ask_again.is_none() && self.ask_gap < ASK_GAP_MAX {
            self.ask_gap = (self.ask_gap * 2).max(ASK_GAP_MIN);
            self.ask_again = Some(now + self.ask_gap);
        }
    }

    /// The largest Data Message payload: the peer's receive Private Buffer
    /// minus the BSDH (§9.1, §10 constraint 3).
    fn max_payload(&self) -> u64 {
        self.peer.map_or(0, |p| {
            let size = self
                .resize
                .smaller
                .map_or(p.rcv_size, |s| s.min(p.rcv_size));
            u64::from(size).saturating_sub(wire::BSDH_LEN as u64)
        })
    }

    fn next_wr(&mut self) -> u64 {
        let id = SEND_WR_BIT | self.next_send_id;
        self.next_send_id = self.next_send_id.wrapping_add(1) & !SEND_WR_BIT;
        id
    }

    /// Emits a message without payload.
    fn emit(&mut self, body: Body<'_>, flags: Flags, what: Sent) -> Op {
        let (mseq, bufs, mseq_ack) = self.credits.on_send();
        let repr = MessageRepr {
            bufs,
            flags,
            mseq,
            mseq_ack,
            body,
        };
        let mut buf = [0u8; MAX_HEADER_LEN];
        let len = repr.header_len().min(MAX_HEADER_LEN);
        repr.emit_header(&mut buf[..len]);
        let header = SendHeader::from_array(buf, len);
        let at = self.tx.sent();
        self.post_send(body.mid(), flags, header, at..at, what)
    }

    /// Emits a Data Message with payload.
    fn emit_data(&mut self, chunk: Chunk) -> Op {
        let (mseq, bufs, mseq_ack) = self.credits.on_send();
        let payload_len = chunk.range.end.saturating_sub(chunk.range.start);
        // max_payload keeps this below 2^31.
        let len = u32::try_from(payload_len + wire::BSDH_LEN as u64).unwrap_or(u32::MAX);
        let bsdh = BsdhRepr {
            mid: Mid::DATA,
            flags: chunk.flags,
            bufs,
            len,
            mseq,
            mseq_ack,
        };
        let mut buf = [0u8; MAX_HEADER_LEN];
        bsdh.emit(&mut Bsdh::new_unchecked(&mut buf[..wire::BSDH_LEN]));
        let header = SendHeader::from_array(buf, wire::BSDH_LEN);
        self.tx.on_chunk_sent(&chunk);
        self.on_payload_sent(payload_len);
        self.post_send(Mid::DATA, chunk.flags, header, chunk.range, Sent::Other)
    }

    fn post_send(
        &mut self,
        mid: Mid,
        flags: Flags,
        header: SendHeader,
        payload: core::ops::Range<u64>,
        what: Sent,
    ) -> Op {
        let wr_id = self.next_wr();
        self.sends.push_back(SendRecord {
            wr_id,
            stream_end: payload.end,
            what,
        });
        Op::Send {
            wr_id: WrId(wr_id),
            kind: SendKind::for_message(mid, flags),
            header,
            payload,
        }
    }

    // ----- inputs: events ----------------------------------------------

    /// Feeds one verbs or LLP event.
    pub fn handle_event(&mut self, now: Instant, event: Event) {
        if self.is_suspended() {
            // §13.1.1 step 4: this LLP connection is done with; the
            // connection goes on with [`Conn::resume`].
            return;
        }
        match event {
            Event::Established => {
                if self.state == State::HelloReceived {
                    // §8.1.1 step 6: "The Accepting Peer MUST set the Flow
                    // Control Mode to Combined Mode and MAY immediately
                    // commence data transfer."
                    self.state = State::Connected;
                    self.hello_ack_due = true;
                }
            }
            Event::RecvDone { wr_id, len } => self.on_recv(now, wr_id, len, None),
            Event::RecvInvalidate { wr_id, len, stag } => self.on_recv(now, wr_id, len, Some(stag)),
            Event::SendDone { wr_id } => self.on_send_done(now, wr_id, Sent::Other),
            Event::WriteDone { wr_id } => self.on_send_done(now, wr_id, Sent::Write),
            Event::ReadDone { wr_id } => self.on_send_done(now, wr_id, Sent::Read),
            Event::Registered { mem, stag, to } => self.on_registered(mem, stag, to),
            Event::TransportError(kind) => self.on_transport_error(kind),
            Event::TransportClosed => self.on_transport_closed(),
        }
        if self.state == State::Connected {
            self.sink_progress();
            self.source_settle();
        }
    }

    /// Acts on an expired timer.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.hold.tick(now, self.config.coalesce);
        if self.ask_again.is_some_and(|t| now >= t) {
            self.ask_again = None;
            self.asked = false;
        }
        if self.state == State::Connected {
            self.zcopy_timeout(now);
        }
        let Some(deadline) = self.deadline else {
            return;
        };
        if now < deadline {
            return;
        }
        self.deadline = None;
        if self.state == State::Closed {
            return;
        }
        if matches!(self.ending, Ending::DisConn { done: true, .. }) && self.peer_disconn.is_some()
        {
            // Both DisConns went; the peer never closed the LLP.
            self.reason.get_or_insert(CloseReason::Graceful);
            self.finish(Teardown::Graceful);
        } else {
            self.abort_with(CloseReason::Timeout, Some(Error::TimedOut));
        }
    }

    fn on_send_done(&mut self, now: Instant, wr_id: WrId, kind: Sent) {
        if self.state == State::Closed {
            return;
        }
        // Send Queue work requests complete in order (RFC 5040 §5), each
        // with its own kind of completion.
        match self.sends.front() {
            Some(s) if s.wr_id == wr_id.0 && s.what.completes_as() == kind => {}
            _ => return self.violation(Violation::BadCompletion),
        }
        let Some(record) = self.sends.pop_front() else {
            return;
        };
        self.tx.release(record.stream_end);
        match record.what {
            Sent::Other => {}
            Sent::Write => self.on_write_done(),
            Sent::Read => self.on_read_done(),
            Sent::DisConn => {
                if let Ending::DisConn { done, .. } = &mut self.ending {
                    *done = true;
                }
                self.check_graceful(now);
            }
            // §8.2.2: "Once the AbortConn Message completion event occurs,
            // an SDP implementation MUST use the normal LLP connection
            // teardown protocol to complete the teardown."
            Sent::AbortConn => self.finish(Teardown::Graceful),
            Sent::SuspCommAck => self.on_susp_comm_ack_done(),
        }
    }

    fn on_transport_error(&mut self, kind: ErrorKind) {
        if self.state == State::Closed {
            return;
        }
        let error = match (self.state, kind) {
            // The reconnection of a socket duplication failed: the
            // application's connection is lost (see [`suspend`]).
            _ if self.resuming => Error::ConnectionReset,
            (State::HelloSent, _) | (_, ErrorKind::Refused) => Error::ConnectionRefused,
            (_, ErrorKind::TimedOut) => Error::TimedOut,
            _ => Error::ConnectionReset,
        };
        self.reason.get_or_insert(CloseReason::Transport(kind));
        self.error.get_or_insert(error);
        // §8.2.2: the LLP is not valid: no more SDP Messages.
        self.finish(Teardown::Abortive);
    }

    fn on_transport_closed(&mut self) {
        if self.state == State::Closed {
            return;
        }
        if self.local_suspend == LocalSuspend::Acked {
            // The test-only Local Peer: the suspended LLP connection ends.
            self.reason.get_or_insert(CloseReason::Graceful);
            self.finish(Teardown::Graceful);
        } else if self.state == State::Connected
            && self.peer_disconn.is_some()
            && self.abort_conn == AbortConn::None
        {
            // §8.2.1 step 4: "If a DisConn Message was received without an
            // AbortConn, the graceful close was successfully completed."
            self.reason.get_or_insert(CloseReason::Graceful);
            self.finish(Teardown::Graceful);
        } else {
            // §8.2.2: "MUST consider the connection abortively torn down if
            // the LLP connection is torn down without receiving a DisConn
            // Message".
            let error = if self.state == State::HelloSent {
                Error::ConnectionRefused
            } else {
                Error::ConnectionReset
            };
            self.reason.get_or_insert(CloseReason::TornDown);
            self.error.get_or_insert(error);
            self.finish(Teardown::Abortive);
        }
    }

    fn on_recv(&mut self, now: Instant, wr_id: WrId, len: usize, invalidated: Option<u32>) {
        if self.state == State::Closed {
            return;
        }
        match self.posted.front() {
            Some(&buf) if buf as u64 == wr_id.0 => {}
            _ => return self.violation(Violation::BadCompletion),
        }
        let Some(buf) = self.posted.pop_front() else {
            return;
        };
        // §10 constraint 3: "A Local Peer MUST NOT send SDP Messages larger
        // than the size of the Remote Peer's receive Private Buffers."
        let size = self.pool.buf_size();
        if len > size {
            return self.violation(Violation::MessageTooLarge { len, size });
        }
        match self.parse(buf, len) {
            Ok(msg) => self.on_message(now, buf, msg, invalidated),
            Err(v) => self.violation(v),
        }
    }

    /// Parses and checks the message in `buf` (§6 rules needing no state).
    fn parse(&self, buf: usize, len: usize) -> Result<Received, Violation> {
        let bytes = self
            .pool
            .buffer(buf)
            .and_then(|b| b.get(..len))
            .ok_or(Violation::BadCompletion)?;
        let msg = MessageRepr::parse(bytes)?;
        if let Body::Other { mid, .. } = msg.body {
            // §6.1.1 Figure 3: reserved and experimental values define no
            // message.
            return Err(Violation::ReservedMid(mid));
        }
        msg.validate()?;
        let hello_ack = if self.state == State::HelloSent || self.resuming {
            // §8.1.1 step 2: the Accepting Peer's first iWARP Message is the
            // HelloAck; step 7a checks.
            Some(setup::check_hello_ack(&msg)?)
        } else {
            None
        };
        let susp_port = match msg.body {
            Body::SuspComm(sch) => Some(sch.port),
            _ => None,
        };
        let payload = msg.body.payload();
        let start = msg.header_len();
        let compl_len = match msg.body {
            Body::RdmaRdCompl(r) => r.len,
            Body::RdmaWrCompl(r) => r.len,
            Body::ChRcvBufAck(r) => r.act_sz,
            _ => 0,
        };
        let (sink_avail, src_avail) = match msg.body {
            Body::SinkAvail { header, .. } => (Some(header), None),
            Body::SrcAvail { header, .. } => (None, Some(header)),
            _ => (None, None),
        };
        let mode_change = match msg.body {
            Body::ModeChange(m) => Some(m),
            _ => None,
        };
        Ok(Received {
            compl_len,
            sink_avail,
            src_avail,
            mode_change,
            bufs: msg.bufs,
            flags: msg.flags,
            mseq: msg.mseq,
            mseq_ack: msg.mseq_ack,
            mid: msg.body.mid(),
            payload: start..start + payload.len(),
            last: payload.last().copied().unwrap_or(0),
            hello_ack,
            susp_port,
        })
    }

    /// The Accepting Peer's HelloAck parameters take effect (§8.1.1
    /// step 7): its Bufs as our send credits, IRD/ORD, minor version.
    fn take_hello_ack(&mut self, peer: PeerParams) {
        // §6.2.2: "MSeq = set to zero and not checked on receive".
        self.credits.hello_ack_received(peer.bufs);
        let (ird, ord) = setup::adjust_ird_ord(&self.config, &peer);
        self.ird = ird;
        self.ord = ord;
        self.minor = setup::minor_version(&peer);
        self.peer = Some(peer);
    }

    fn on_message(&mut self, now: Instant, buf: usize, msg: Received, invalidated: Option<u32>) {
        if self.resuming {
            return self.on_resumed_hello_ack(buf, &msg);
        }
        match self.state {
            State::HelloSent => {
                let Some(peer) = msg.hello_ack else {
                    return self.violation(Violation::UnexpectedMessage(msg.mid));
                };
                self.take_hello_ack(peer);
                // §8.1.1 step 7e: Combined Mode, data may flow.
                self.state = State::Connected;
                self.repost(buf, PostKind::Fresh);
                return;
            }
            // §8.1.1 step 2: "The Connecting Peer MUST NOT send any iWARP
            // Messages until a HelloAck Message is received".
            State::HelloReceived => return self.violation(Violation::UnexpectedMessage(msg.mid)),
            State::Connected => {}
            State::Closed => return,
        }
        let has_payload = !msg.payload.is_empty();
        let credit_before = self.credits.send_credit();
        if let Err(fault) = self
            .credits
            .on_receive(msg.mseq, msg.mseq_ack, msg.bufs, has_payload)
        {
            return self.violation(Violation::Credit(fault));
        }
        if self.credits.send_credit() > credit_before {
            self.on_credit(now);
        }
        self.on_mseq_ack(msg.mseq_ack);
        // RFC 5040 §6.1: only the completions of §9.2 and §9.3 invalidate
        // our STags.
        if let Some(stag) = invalidated {
            if !matches!(msg.mid, Mid::RDMA_RD_COMPL | Mid::RDMA_WR_COMPL) {
                return self.violation(Violation::WrongStag {
                    mid: msg.mid,
                    got: stag,
                });
            }
        }
        if msg.flags.contains(Flags::OOB_PEND) {
            // §9.5.3: the OOB byte follows within 65,535 bytes.
            if self.oob_pend.len() >= usize::from(u16::MAX) {
                return self.violation(Violation::OobPendTooFar);
            }
            self.oob_pend.push_back(self.rx.total());
            self.urgent_notice = true;
        }
        match msg.mid {
            Mid::DATA => self.on_data(buf, &msg),
            Mid::SRC_AVAIL => self.on_src_avail(buf, &msg),
            Mid::SINK_AVAIL => {
                let Some(header) = msg.sink_avail else {
                    return;
                };
                if !self.on_sink_avail(header, !msg.payload.is_empty()) {
                    return;
                }
                // §9.4: "the Data Source MUST process the ULP payload
                // normally regardless of whether the SinkAvail was
                // discarded".
                self.take_payload(buf, &msg);
            }
            Mid::SEND_SM => {
                self.repost(buf, PostKind::Fresh);
                self.on_send_sm(msg.mseq_ack);
            }
            Mid::RDMA_RD_COMPL => {
                self.repost(buf, PostKind::Fresh);
                self.on_rdma_rd_compl(msg.compl_len, msg.flags, invalidated);
            }
            Mid::RDMA_WR_COMPL => {
                self.repost(buf, PostKind::Fresh);
                self.on_rdma_wr_compl(msg.compl_len, msg.flags, invalidated);
            }
            Mid::SRC_AVAIL_CANCEL => {
                self.repost(buf, PostKind::Fresh);
                self.on_src_avail_cancel(msg.mseq);
            }
            Mid::SINK_AVAIL_CANCEL => {
                self.repost(buf, PostKind::Fresh);
                self.on_sink_avail_cancel();
            }
            Mid::SINK_CANCEL_ACK => {
                self.repost(buf, PostKind::Fresh);
                self.on_sink_cancel_ack();
            }
            Mid::MODE_CHANGE => {
                self.repost(buf, PostKind::Fresh);
                if let Some(mch) = msg.mode_change {
                    self.on_mode_change(mch);
                }
            }
            Mid::CH_RCV_BUF_ACK => {
                self.repost(buf, PostKind::Fresh);
                self.on_ch_rcv_buf_ack(msg.compl_len);
            }
            Mid::DIS_CONN => {
                // A second DisConn.
                if self.peer_disconn.is_some() {
                    return self.violation(Violation::UnexpectedMessage(Mid::DIS_CONN));
                }
                // §8.2.1 (Remote Peer) step 1: complete receives and report
                // the end of the stream; our SinkAvails count as canceled.
                self.peer_disconn = Some(msg.mseq_ack);
                self.on_peer_disconn();
                self.repost(buf, PostKind::Fresh);
                self.check_graceful(now);
            }
            Mid::ABORT_CONN => {
                // §8.2.2: AbortConn "tells the Remote Peer to ignore an
                // earlier DisConn Message (if received) and to consider
                // socket teardown as abortive".
                self.reason.get_or_insert(CloseReason::PeerAbort);
                self.error.get_or_insert(Error::ConnectionReset);
                self.finish(Teardown::Abortive);
            }
            Mid::CH_RCV_BUF => {
                // §10.6.1: "If both peers concurrently send each other
                // ChRcvBuf Messages, then the Accepting Peer MUST disregard
                // the ChRcvBuf Message."
                if !(self.role == Role::Accepting && self.resize.asked.is_some()) {
                    self.control.push_back(Control::ChRcvBufAck);
                    // "The Connecting Peer MAY re-send its ChRcvBuf Message
                    // after sending the ChRcvBufAck Message": ours crossed
                    // this one and the Accepting Peer disregards it.
                    if let Some(size) = self.resize.asked {
                        self.control.push_back(Control::ChRcvBuf { size });
                    }
                }
                self.repost(buf, PostKind::Fresh);
            }
            Mid::SUSP_COMM => self.on_susp_comm(buf, msg.susp_port),
            Mid::SUSP_COMM_ACK if self.local_suspend == LocalSuspend::Sent => {
                self.on_local_susp_comm_ack(buf)
            }
            // Hello and HelloAck after setup; SuspCommAck answers something
            // we never sent (a SuspCommAck is expected only by the
            // test-only Local Peer, see [`suspend`]).
            mid => self.violation(Violation::UnexpectedMessage(mid)),
        }
        if self.state == State::Connected {
            if let Some(&at) = self.oob_pend.front() {
                if self.rx.total().saturating_sub(at) >= OOB_PEND_REACH {
                    self.violation(Violation::OobPendTooFar);
                }
            }
        }
    }

    fn on_data(&mut self, buf: usize, msg: &Received) {
        if msg.payload.is_empty() {
            // A gratuitous credit update (§6.3.1), maybe with OOB_PEND.
            let kind = if msg.flags.is_empty() {
                PostKind::Pure
            } else {
                PostKind::Fresh
            };
            return self.repost(buf, kind);
        }
        if !self.accept_payload(Mid::DATA, msg) {
            return;
        }
        self.on_payload_received(msg.payload.len());
        if !msg.flags.contains(Flags::OOB_PRES) {
            self.rx.push(buf, msg.payload.start, msg.payload.end);
            return;
        }
        // §9.5.3: OOB_PEND "MUST be set on an SDP Message that is sent no
        // later than the SDP Message containing the Out-Of-Band data byte".
        let Some(pend_at) = self.oob_pend.pop_front() else {
            return self.violation(Violation::OobPresWithoutPend);
        };
        let offset = self.rx.total() + (msg.payload.len() as u64 - 1);
        // §9.5.3: "no more than 65,535 (2^16-1) bytes of data are sent
        // between the flag and its associated Out-Of-Band data byte".
        if (offset + 1).saturating_sub(pend_at) > OOB_PEND_REACH {
            return self.violation(Violation::OobPendTooFar);
        }
        self.rx.push(buf, msg.payload.start, msg.payload.end);
        let mut freed = core::mem::take(&mut self.freed);
        self.rx
            .set_mark(offset, msg.last, self.config.oob_inline, &mut freed);
        for b in freed.drain(..) {
            self.repost(b, PostKind::Fresh);
        }
        self.freed = freed;
    }

    /// §9.2, §11.2, §11.3: a SrcAvail; in Combined Mode it carries the
    /// first bytes of the buffer as stream data.
    fn on_src_avail(&mut self, buf: usize, msg: &Received) {
        let Some(header) = msg.src_avail else {
            return;
        };
        if !msg.payload.is_empty() && !self.accept_payload(Mid::SRC_AVAIL, msg) {
            return;
        }
        if !self.on_src_avail_z(header, msg.payload.len()) {
            return;
        }
        if msg.payload.is_empty() {
            self.repost(buf, PostKind::Fresh);
        } else {
            self.on_payload_received(msg.payload.len());
            self.rx.push(buf, msg.payload.start, msg.payload.end);
        }
    }

    /// The ULP payload of a SinkAvail (§9.4), or its buffer back.
    fn take_payload(&mut self, buf: usize, msg: &Received) {
        if msg.payload.is_empty() {
            return self.repost(buf, PostKind::Fresh);
        }
        if !self.accept_payload(Mid::SINK_AVAIL, msg) {
            return;
        }
        self.on_payload_received(msg.payload.len());
        self.rx.push(buf, msg.payload.start, msg.payload.end);
    }

    /// Whether ULP payload may arrive now; closes the connection if not.
    fn accept_payload(&mut self, mid: Mid, msg: &Received) -> bool {
        if self.peer_disconn.is_some() {
            self.violation(Violation::DataAfterDisConn);
            return false;
        }
        // §11.2: after a SrcAvail the Data Source "MUST NOT send any SDP
        // Messages containing a ULP payload until ... a RdmaRdCompl or
        // SendSm Message is received"; §11.3 likewise.
        if let Err(v) = self.zcopy_payload_ok(mid, msg.mseq_ack, msg.payload.len()) {
            self.violation(v);
            return false;
        }
        if self.reading == Reading::Released {
            // Nobody will read it: Linux TCP answers data after close()
            // with a reset.
            self.abort_with(CloseReason::LocalAbort, None);
            return false;
        }
        true
    }

    fn repost(&mut self, buf: usize, kind: PostKind) {
        // After a SuspCommAck, buffers freed stay unposted: the new LLP
        // connection posts its own (see [`Conn::resume`]).
        if self.state != State::Closed && !self.suspend.ack_sent() {
            self.to_post.push_back((buf, kind));
        }
    }

    // ----- inputs: the socket calls -------------------------------------

    /// Offers `len` more bytes of the send stream. Returns how many are
    /// accepted (limited by [`Config::send_buffer`]); they get the next
    /// send stream offsets, `tx().accepted() - n .. tx().accepted()`, and
    /// the adapter keeps them until their Sends complete. With
    /// [`SendFlags::OOB`] the last accepted byte is urgent (§9.5.3).
    ///
    /// Errors: EAGAIN while the send buffer is full or before setup
    /// finished; a pending connection error once (ECONNRESET, ETIMEDOUT,
    /// ...); then EPIPE after shutdown(SHUT_WR), close or abort (§8.2.1:
    /// "MUST reject any send data posted by the ULP after the ULP close
    /// call").
    pub fn send(&mut self, len: usize, flags: SendFlags) -> Result<usize, Error> {
        self.send_allowed()?;
        if len == 0 {
            return Ok(0);
        }
        // A ULP buffer handed to send_zcopy is still in flight: its call
        // has not returned (a cancel may take back its tail, §9.5.4).
        if self.zsend_pending() {
            return Err(Error::WouldBlock);
        }
        self.large_writes = len as u64 >= self.max_payload();
        let room = self.send_room();
        self.credit_wanted = self.credit_bound && room < len as u64;
        if room == 0 {
            return Err(Error::WouldBlock);
        }
        let n = (len as u64).min(room);
        let oob = flags.contains(SendFlags::OOB);
        self.tx.accept(n, oob);
        self.hold.wrote(self.large_writes, oob);
        Ok(n as usize)
    }

    /// How many bytes a send takes now: what the send buffer has room
    /// for, and for a credit-bound conn ([`Conn::set_credit_bound`])
    /// writing a message's worth or more at a time, no more than the
    /// peer's credits carry beyond the bytes already waiting for them.
    /// Smaller writes still wait for credit in the send buffer, where they
    /// gather into full messages (one message each would spend a credit, a
    /// whole Private Buffer of the peer, on a few bytes). Writability
    /// follows the same rule for the same kind of write as the last, so a
    /// program that polls before each write never finds POLLOUT and then
    /// EAGAIN twice in a row.
    fn send_room(&self) -> u64 {
        let room = self.config.send_buffer.saturating_sub(self.tx.buffered());
        if !self.credit_bound || !self.large_writes {
            return room;
        }
        room.min(self.credited_room())
    }

    /// Payload bytes the send credit lets go now (§10.5: a Data Message
    /// with payload needs three credits) beyond the bytes waiting for it.
    fn credited_room(&self) -> u64 {
        let messages = self.credits.send_credit() - (PAYLOAD_MIN_CREDIT - 1);
        let carried = u64::try_from(messages).unwrap_or(0) * self.max_payload();
        carried.saturating_sub(self.tx.unsent())
    }

    /// The checks every send call makes.
    fn send_allowed(&mut self) -> Result<(), Error> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match self.state {
            State::HelloSent | State::HelloReceived => return Err(Error::WouldBlock),
            State::Closed => return Err(Error::BrokenPipe),
            State::Connected => {}
        }
        if self.ending != Ending::Open || self.abort_conn != AbortConn::None {
            return Err(Error::BrokenPipe);
        }
        Ok(())
    }

    /// Asks the peer to change its receive Private Buffer size to `size`
    /// (§10.6). EAGAIN while a request is unacknowledged, EINVAL for a
    /// direction §10.6 no longer allows or a size below the §10 minimum.
    pub fn request_buf_size(&mut self, size: u32) -> Result<(), Error> {
        let Some(peer) = self.peer else {
            return Err(Error::NotConnected);
        };
        if self.state != State::Connected {
            return Err(Error::NotConnected);
        }
        // §10.6: "The Local Peer MUST NOT send a new ChRcvBuf Message if
        // there is an unacknowledged ChRcvBuf Message."
        if self.resize.asked.is_some() {
            return Err(Error::WouldBlock);
        }
        let current = self.resize.smaller.unwrap_or(peer.rcv_size);
        let larger = size > current;
        if size < setup::MIN_BUF_SIZE
            || size == current
            || (larger && self.resize.no_more_increase)
            || (!larger && self.resize.no_more_decrease)
        {
            return Err(Error::InvalidInput);
        }
        self.resize.asked = Some(size);
        if !larger {
            // "If the Local Peer requests a smaller receive Private Buffer
            // in the ChRcvBuf Message, the Local Peer MUST begin using the
            // smaller size immediately after sending the ChRcvBuf Message."
            self.resize.smaller = Some(size);
        }
        self.control.push_back(Control::ChRcvBuf { size });
        Ok(())
    }

    /// ChRcvBufAck (§10.6).
    fn on_ch_rcv_buf_ack(&mut self, act_sz: u32) {
        let (Some(asked), Some(peer)) = (self.resize.asked, self.peer.as_mut()) else {
            return self.violation(Violation::UnexpectedMessage(Mid::CH_RCV_BUF_ACK));
        };
        let original = peer.rcv_size;
        let larger = asked > original;
        // "if the Local Peer requests a decrease, the Remote Peer MUST
        // either decrease the size or leave it unchanged, and it MUST NOT
        // decrease the Private Buffer size to be smaller than that
        // requested. Conversely, if the Local Peer requests an increase,
        // the Remote Peer MUST either increase the size or leave it
        // unchanged."
        let ok = if larger {
            act_sz >= original
        } else {
            act_sz <= original && act_sz >= asked
        };
        if !ok || act_sz < setup::MIN_BUF_SIZE {
            return self.violation(Violation::BadChRcvBufAck(act_sz));
        }
        if act_sz == original {
            if larger {
                self.resize.no_more_increase = true;
            } else {
                self.resize.no_more_decrease = true;
            }
        }
        peer.rcv_size = act_sz;
        self.resize.asked = None;
        self.resize.smaller = None;
    }

    /// Copies received bytes into `buf` and gives emptied receive buffers
    /// back to the peer (re-posted, credited on the next message). Never
    /// blocks: EAGAIN when nothing is there; 0 at the end of the stream
    /// (the peer's DisConn, SHUT_RD, or after the connection closed and a
    /// pending error was reported).
    ///
    /// Linux TCP semantics: a read stops at the urgent mark; the urgent
    /// byte is skipped unless SO_OOBINLINE. [`RecvFlags::PEEK`] copies
    /// without consuming. [`RecvFlags::OOB`] reads the urgent byte: EINVAL
    /// with SO_OOBINLINE or when there is none, EAGAIN while it is
    /// announced (OOB_PEND) but not here. [`RecvFlags::WAITALL`] returns
    /// what is there like a plain read — the blocking caller repeats until
    /// its buffer is full, the stream ends or an error comes — except
    /// with PEEK, where it reports EAGAIN until `buf.len()` bytes are there
    /// (or no more can come because every receive buffer holds data).
    pub fn recv(&mut self, buf: &mut [u8], flags: RecvFlags) -> Result<usize, Error> {
        let peek = flags.contains(RecvFlags::PEEK);
        if flags.contains(RecvFlags::OOB) {
            return self.recv_oob(buf, peek);
        }
        if matches!(self.state, State::HelloSent | State::HelloReceived) {
            return Err(Error::WouldBlock);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let inline = self.config.oob_inline;
        if peek && flags.contains(RecvFlags::WAITALL) && !self.at_eof() {
            let full = self.rx.held_buffers() + 2 >= self.pool.len();
            if self.rx.readable(inline) < buf.len() as u64 && !full {
                return Err(Error::WouldBlock);
            }
        }
        let mut freed = core::mem::take(&mut self.freed);
        let n = self.rx.read(&self.pool, buf, peek, inline, &mut freed);
        for b in freed.drain(..) {
            self.repost(b, PostKind::Fresh);
        }
        self.freed = freed;
        if n > 0 {
            self.sink_progress();
            return Ok(n);
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.at_eof() {
            return Ok(0);
        }
        if self.state == State::Connected && self.rx.queued() == 0 {
            // The peer may wait for what we hold before it answers.
            self.hold.push();
            self.recv_would_block();
        }
        Err(Error::WouldBlock)
    }

    /// Whether a reader that waits now would get the next message's
    /// payload first: connected, nothing received unread, no urgent mark,
    /// more may come. A link may then place that payload straight into the
    /// reader's buffer (DESIGN §7) and report it with
    /// [`Conn::consume_placed`].
    pub fn rx_waiting(&self) -> bool {
        self.state == State::Connected
            && self.rx.queued() == 0
            && self.rx.mark.is_none()
            && !self.at_eof()
    }

    /// The first `n` unread bytes were placed in the reader's buffer by the
    /// transport: they are the first bytes of the message just received,
    /// with `payload` bytes, the stream having been empty before it
    /// ([`Conn::rx_waiting`]). They count as read — buffers emptied are
    /// re-posted and credited as by [`Conn::recv`]. False (nothing
    /// consumed) unless exactly that message's bytes are unread and no mark
    /// is set.
    pub fn consume_placed(&mut self, n: usize, payload: usize) -> bool {
        if n > payload || self.rx.queued() != payload as u64 || self.rx.mark.is_some() {
            return false;
        }
        let mut freed = core::mem::take(&mut self.freed);
        self.rx.consume(n, &mut freed);
        for b in freed.drain(..) {
            self.repost(b, PostKind::Fresh);
        }
        self.freed = freed;
        true
    }

    /// No more bytes will arrive.
    fn at_eof(&self) -> bool {
        self.peer_disconn.is_some() || self.reading != Reading::Open || self.state == State::Closed
    }

    /// `recv(MSG_OOB)` as Linux `tcp_recv_urg`.
    fn recv_oob(&mut self, buf: &mut [u8], peek: bool) -> Result<usize, Error> {
        if self.config.oob_inline {
            return Err(Error::InvalidInput);
        }
        match self.rx.mark.as_mut() {
            Some(mark) if !mark.read => {
                if !peek {
                    mark.read = true;
                }
                match buf.first_mut() {
                    Some(b) => {
                        *b = mark.byte;
                        Ok(1)
                    }
                    None => Ok(0),
                }
            }
            _ if !self.oob_pend.is_empty() => {
                if self.at_eof() {
                    Ok(0)
                } else {
                    Err(Error::WouldBlock)
                }
            }
            _ => Err(Error::InvalidInput),
        }
    }

    /// SIOCATMARK: the next byte to read is the urgent byte.
    pub fn at_mark(&self) -> bool {
        self.rx.at_mark()
    }

    /// An urgent byte waits to be read (POLLPRI).
    pub fn urgent_ready(&self) -> bool {
        self.rx.mark.is_some_and(|m| !m.read)
    }

    /// Whether an OOB_PEND arrived since the last call (for SIGURG).
    pub fn take_urgent_notice(&mut self) -> bool {
        core::mem::take(&mut self.urgent_notice)
    }

    /// SO_OOBINLINE.
    pub fn set_oob_inline(&mut self, inline: bool) {
        self.config.oob_inline = inline;
    }

    /// Whether sends take only what the peer's credits carry now, for a
    /// program that waits for POLLOUT itself (O_NONBLOCK) instead of in
    /// the call: a write that finds no credit is refused (EAGAIN), its
    /// bytes stay in the program's buffer, and POLLOUT comes with the
    /// credit, when they go from that buffer to the socket without the
    /// copy into the send buffer that would otherwise hold them meanwhile
    /// (DESIGN §7 "Copies"). Writes smaller than a message still gather
    /// in the send buffer behind missing credit (see `Conn::send_room`).
    /// Off: sends fill the send buffer whatever the credit, for calls that
    /// wait.
    pub fn set_credit_bound(&mut self, on: bool) {
        self.credit_bound = on;
    }

    /// TCP_NODELAY: every message goes as soon as credit allows; no short
    /// tail of a write waits for the next write ([`Conn::holds`]).
    pub fn set_nodelay(&mut self, on: bool) {
        self.nodelay = on;
    }

    /// Whether TCP_NODELAY is set ([`Conn::set_nodelay`]).
    pub fn nodelay(&self) -> bool {
        self.nodelay
    }

    /// SO_SNDBUF: how many accepted bytes may wait for their Sends to
    /// complete from now on (bytes already accepted stay).
    pub fn set_send_buffer(&mut self, bytes: u64) {
        self.config.send_buffer = bytes.max(1);
    }

    /// Readable (POLLIN): data (a SrcAvail waiting for a reader too), end
    /// of stream, or a pending error.
    pub fn readable(&self) -> bool {
        match self.state {
            State::HelloSent | State::HelloReceived => false,
            _ => {
                self.rx.readable(self.config.oob_inline) > 0
                    || self.completion_ready()
                    || self.error.is_some()
                    || self.at_eof()
                    || self.src_avail_unanswered()
            }
        }
    }

    /// Writable (POLLOUT): a send would accept at least one byte, or fail
    /// at once.
    pub fn writable(&self) -> bool {
        match self.state {
            State::HelloSent | State::HelloReceived => false,
            State::Closed => true,
            State::Connected => {
                self.error.is_some()
                    || self.ending != Ending::Open
                    || self.abort_conn != AbortConn::None
                    || self.send_room() > 0
            }
        }
    }

    /// Whether control messages wait to be sent (a SendSm that a `recv`
    /// finding nothing queued, say): whoever goes to sleep drives the link
    /// first, or the peer would wait for it.
    pub fn control_pending(&self) -> bool {
        !self.control.is_empty()
    }

    /// Bytes readable now (FIONREAD).
    pub fn bytes_readable(&self) -> u64 {
        self.rx.readable(self.config.oob_inline)
    }
}
