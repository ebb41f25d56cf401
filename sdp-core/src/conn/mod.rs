//! The SDP connection (draft-pinkerton-iwarp-sdp-01): a sans-IO state
//! machine that speaks verbs values ([`crate::verbs`]).
//!
//! Read first: draft §8 (setup and teardown), §9.1 (Bcopy), §9.5.3 (OOB),
//! §10 (Private Buffers and credits), §14.2 (solicited events).
//!
//! * [`setup`] — Hello/HelloAck (§8.1.1).
//! * [`credit`] — §10.2–§10.5 credit arithmetic.
//! * [`recv`] — the receive half: the Private Buffer pool, the received
//!   stream, what each arriving message does, `recv` and readability.
//! * [`send`] — the transmit half: the send stream, Data Message
//!   chunking, the choice of the next message (§10.5), `send` and
//!   writability.
//! * `resize` — ChRcvBuf (§10.6).
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
pub mod local;
pub mod recv;
mod resize;
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
pub(crate) use recv::grow;
pub use recv::BufferPool;
pub use setup::{Config, Pipelining};
pub use zcopy::{Completion, ZcopyState, ZcopyStats};

use credit::Credits;
use recv::RxStream;
use resize::Resize;
use send::{Hold, TxStream};
use setup::PeerParams;
use suspend::{LocalSuspend, Suspend};

use crate::errno::Error;
use crate::verbs::{ErrorKind, Event, Op, RdmaOp, Teardown, Work, WrId};
use crate::wire::{self, Flags, Mid, HELLO_MSG_LEN};

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
    /// Our ring for the peer's LocalData ([`local`]).
    LocalOffer,
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

/// A Send posted and not completed.
#[derive(Debug, Clone, Copy)]
struct SendRecord {
    wr_id: u64,
    stream_end: u64,
    what: Sent,
    /// An RDMA Read or Write the adapter carried out itself
    /// ([`Event::DoneLocally`]): it completes once the work before it has.
    done: bool,
}

/// Send work request ids carry this bit; receive ids are buffer indices.
const SEND_WR_BIT: u64 = 1 << 63;
/// The first wait before a credit request goes again after one that
/// brought no credit for payload ([`Conn::on_credit`]).
const ASK_GAP_MIN: Duration = Duration::from_millis(1);
/// The longest such wait; after it, requests stop until credit for
/// payload comes.
const ASK_GAP_MAX: Duration = Duration::from_millis(64);

/// `a` is at or after `b` in 32-bit sequence space.
fn seq_ge(a: u32, b: u32) -> bool {
    a.wrapping_sub(b) < 1 << 31
}

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
    local_offer: Option<wire::LocalOfferRepr>,
    local_data: Option<wire::LocalDataRepr>,
}

impl Received {
    /// ULP payload bytes: in the buffer, or in our ring for a LocalData.
    fn payload_len(&self) -> usize {
        match self.local_data {
            Some(ldh) => ldh.len as usize,
            None => self.payload.len(),
        }
    }
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
    /// Boxed: an Accepting Peer has none, and a connection lives long
    /// after its Hello went.
    hello: Option<Box<[u8; HELLO_MSG_LEN]>>,
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
    /// The same-host path ([`local`]).
    local: local::Local,
    /// Buffers given back since the pool last grew (`Conn::grow_pool`).
    emptied: usize,
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
        let local = local::Local::new(config.local);
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
            local,
            emptied: 0,
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
        conn.hello = Some(Box::new(hello));
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
        conn.local.both = conn.config.local && peer.local;
        conn.peer = Some(peer);
        conn.ird = ird;
        conn.ord = ord;
        conn.minor = setup::minor_version(&peer);
        Ok(conn)
    }

    /// Accepting Peer: the setup ends at `deadline` unless the iWARP
    /// connection is up by then — the RTR, the last startup frame (RFC
    /// 6581 §5), is waited for as RFC 5044 §7.1.2 rule 10 asks of the
    /// frames before it ("a reasonable timeout").
    pub fn await_rtr(&mut self, deadline: Instant) {
        if self.state == State::HelloReceived {
            self.deadline = Some(deadline);
        }
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

    /// Payload bytes received and not read yet (OOB bytes among them).
    pub fn rx_unread(&self) -> u64 {
        self.rx.queued()
    }

    /// A figure that changes whenever a byte is accepted for sending,
    /// released by its Send's completion, received or read: the link
    /// tells by it that the connection moved data.
    pub fn stream_progress(&self) -> u64 {
        self.rx
            .total()
            .wrapping_add(self.rx.read_pos())
            .wrapping_add(self.tx.accepted())
            .wrapping_add(self.tx.released())
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

    /// Whether the LLP's graceful teardown follows once what is queued is
    /// written: our DisConn went after the peer's, so its completion ends
    /// the connection (§8.2.1 Remote Peer step 4).
    pub fn fin_follows(&self) -> bool {
        self.state == State::Connected
            && self.abort_conn == AbortConn::None
            && matches!(
                self.ending,
                Ending::DisConn {
                    after_peer: true,
                    ..
                }
            )
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
                    // The RTR's timer ends; a close made meanwhile gets
                    // its own.
                    self.deadline = (self.reading == close::Reading::Released)
                        .then(|| now + self.config.close_timeout);
                }
            }
            Event::RecvDone { wr_id, len } => self.on_recv(now, wr_id, len, None),
            Event::RecvInvalidate { wr_id, len, stag } => self.on_recv(now, wr_id, len, Some(stag)),
            Event::SendDone { wr_id } => self.on_send_done(now, wr_id, Sent::Other),
            Event::WriteDone { wr_id } => self.on_send_done(now, wr_id, Sent::Write),
            Event::ReadDone { wr_id } => self.on_send_done(now, wr_id, Sent::Read),
            Event::DoneLocally { wr_id } => self.on_done_locally(now, wr_id),
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
        if self.state == State::HelloReceived {
            // No RTR (see [`Conn::await_rtr`]): the peer never finished
            // its connect; to the program that has the connection, as a
            // reset.
            self.abort_with(CloseReason::Timeout, Some(Error::ConnectionReset));
        } else if matches!(self.ending, Ending::DisConn { done: true, .. })
            && self.peer_disconn.is_some()
        {
            // Both DisConns went; the peer never closed the LLP.
            self.reason.get_or_insert(CloseReason::Graceful);
            self.finish(Teardown::Graceful);
        } else {
            self.abort_with(CloseReason::Timeout, Some(Error::TimedOut));
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
}
