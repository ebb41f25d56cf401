//! Connection setup (draft §8.1.1, DESIGN §4): the Hello the Connecting
//! Peer puts in the MPA Request's private data (Streaming Mode), the
//! Accepting Peer's checks and IRD/ORD adjustment, the HelloAck and the
//! Connecting Peer's checks of it.
//!
//! ```
//! use sdp_core::conn::setup::{check_hello, hello_message, Config};
//!
//! let config = Config::default();
//! let hello = hello_message(&config);
//! let peer = check_hello(&hello).unwrap();
//! assert_eq!(peer.bufs, config.bufs);
//! assert_eq!(peer.rcv_size, config.buf_size);
//! ```

use core::time::Duration;

use super::close::Violation;
use crate::wire::{
    self, Body, Flags, HelloAckRepr, HelloRepr, MessageRepr, HELLO_MSG_LEN, MAJOR_VERSION,
    MAX_SIZE, MINOR_VERSION,
};

/// §10 constraint 4: "The sizes of both send and receive Private Buffers
/// MUST be at least the size of the BSDH plus the size of the largest
/// extended header in an SDP Message (which is SinkAH) plus one byte."
pub const MIN_BUF_SIZE: u32 = (wire::BSDH_LEN + wire::SinkAvailRepr::HEADER_LEN + 1) as u32;

/// §10.3: "The initial send credit advertisements from each peer MUST be
/// greater than or equal to three"; §10 constraint 2: at least 3 receive
/// Private Buffers.
pub const MIN_BUFS: u16 = 3;

/// Local parameters of a connection. [`Config::normalized`] clamps every
/// field into what the draft allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Receive Private Buffers to post, at least [`MIN_BUFS`] (§10
    /// constraint 2; "RECOMMENDED ... substantially greater than 3").
    pub bufs: u16,
    /// Receive Private Buffers the pool may grow to while the peer runs
    /// out of credit and our application keeps up (TCP's receive buffer
    /// autotuning; see `Conn::grow_pool`). At most `bufs` (0, the
    /// default): the pool stays at `bufs`.
    pub max_bufs: u16,
    /// Size of each receive Private Buffer in bytes, [`MIN_BUF_SIZE`] to
    /// 2^31 (§6.2.1.5, §10 constraint 4). Sent as LocalRcvSz / ActRcvSz.
    pub buf_size: u32,
    /// DesRemRcvSz: the size we would like the peer's receive Private
    /// Buffers to have (§6.2.1.4), a hint.
    pub desired_remote_buf_size: u32,
    /// MaxAdverts: concurrent Zcopy advertisements we accept, 1 to 65535
    /// (§6.2.1.3): SrcAvails and SinkAvails the peer may have outstanding
    /// towards us (§11.3).
    pub max_adverts: u16,
    /// The queue pair's IRD (inbound RDMA Read depth), at least 1.
    pub ird: u16,
    /// The queue pair's ORD (outbound RDMA Read depth), at least 1.
    pub ord: u16,
    /// Send buffer in bytes (SO_SNDBUF): how much accepted data may wait
    /// for its Send to complete.
    pub send_buffer: u64,
    /// SO_OOBINLINE: the urgent byte stays in the normal stream.
    pub oob_inline: bool,
    /// How long a closed (orphaned) connection may take to finish its
    /// graceful close before it is aborted, and how long the first closer
    /// waits for the LLP teardown (Linux `tcp_fin_timeout`: 60 s).
    pub close_timeout: Duration,
    /// The Bcopy Threshold (§11): a ULP buffer handed to
    /// [`Conn::send_zcopy`](super::Conn::send_zcopy) larger than this goes
    /// by Read or Write Zcopy in Combined and Pipelined Mode. At least
    /// `buf_size` (§10 constraint 5). `u64::MAX` (the default): infinite,
    /// Bcopy only.
    pub bcopy_threshold: u64,
    /// Data Sink: RDMA Read advertised buffers into posted receive buffers
    /// (§9.2). Off (the default): every SrcAvail is answered with SendSm
    /// (§9.5.2.1).
    pub read_zcopy: bool,
    /// Data Sink: advertise posted receive buffers with SinkAvail while the
    /// receive half-connection is in Pipelined Mode (§9.3). Off by default.
    pub write_zcopy: bool,
    /// Data Source: when the send half-connection enters and leaves
    /// Pipelined Mode (§12.3, §12.4).
    pub pipelining: Pipelining,
    /// Data Sink: the REQ_PIPE hint in our RdmaRdCompl and RdmaWrCompl
    /// (§6.1.2): we would like the peer's send half in Pipelined Mode.
    pub req_pipe: bool,
    /// Data Source: after this many SendSm in a row, move the send half to
    /// Buffered Mode (§12.1, Figure 30 "Receive SendSm: Advisory"). 0:
    /// never.
    pub buffered_after_send_sm: u32,
    /// Data Source, Pipelined Mode: while the Data Sink keeps its receive
    /// buffers posted ahead of our sends (the last Zcopy buffer went by
    /// Write Zcopy), a Zcopy buffer with no SinkAvail in hand waits this
    /// long for one before it goes by SrcAvail or Bcopy — the choice §9.4
    /// leaves to the Data Source ("whether to wait for the SinkAvail
    /// advertisement, generate a SrcAvail advertisement, or transfer the
    /// ULP data using the Bcopy mechanism"). A SinkAvail arriving (even a
    /// stale one: the Data Sink has caught up) starts a streak; a wait that
    /// runs out ends it. Zero: never wait.
    pub sink_avail_wait: Duration,
    /// A blocking write larger than this lends its buffer to the
    /// connection for the call even when it goes by Bcopy: the Data
    /// Messages are sent straight from it, and the call returns once all
    /// of it is in Sends (a TCP write returns once its bytes are in the
    /// socket buffer) instead of copying what credits hold back into the
    /// send buffer. Its deadline (SO_SNDTIMEO, a signal) leaves out of the
    /// stream what is not yet in a Send. A lent write that sees no credit
    /// for [`LENT_STALL`](crate::stream::zcopy::LENT_STALL) copies its
    /// rest into the send buffer after all: two peers that each write more
    /// than the other's receive buffers before they read get through, as
    /// over TCP. Default 128 KiB; `u64::MAX`: never.
    pub lend_above: u64,
    /// How long the short tail of a write larger than one Data Message
    /// may wait for the next write to fill its message (DESIGN §7 "Small
    /// messages"; see [`Conn::set_nodelay`](super::Conn::set_nodelay)).
    /// Zero (the default): never; a socket layer sets it as TCP has
    /// Nagle on by default (the preload: 200 µs, `SDP_COALESCE_US`).
    pub coalesce: Duration,
    /// Offer the same-host path to a peer that speaks it, and use the
    /// peer's (DESIGN §9, [`super::local`]). Off by default; the preload
    /// turns it on unless `SDP_LOCAL=off`.
    pub local: bool,
    /// Microseconds a blocking reader (or a blocking connect waiting for
    /// the setup's answers) polls its socket before it sleeps when answers
    /// come quickly ([`crate::stream::busy_poll`], DESIGN §7
    /// "Latency"). Zero (the default): it sleeps at once; the preload
    /// sets 50 on a machine with more than one core (`SDP_BUSY_POLL_US`).
    pub busy_poll_us: u32,
}

/// When the Data Source (Mode Master) moves its send half-connection
/// between Combined and Pipelined Mode (§12.3, §12.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pipelining {
    /// Stay out of Pipelined Mode unless asked by
    /// [`Conn::set_send_mode`](super::Conn::set_send_mode).
    Never,
    /// Follow the Data Sink's REQ_PIPE hints (§6.1.2) and fall back to
    /// Combined Mode on a SendSm (Figure 30).
    OnRequest,
    /// Enter Pipelined Mode as soon as the connection is up.
    Always,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            bufs: 16,
            max_bufs: 0,
            buf_size: 64 * 1024,
            desired_remote_buf_size: 64 * 1024,
            max_adverts: 1,
            ird: 1,
            ord: 1,
            send_buffer: 1 << 20,
            oob_inline: false,
            close_timeout: Duration::from_secs(60),
            bcopy_threshold: u64::MAX,
            read_zcopy: false,
            write_zcopy: false,
            pipelining: Pipelining::Never,
            req_pipe: false,
            buffered_after_send_sm: 0,
            sink_avail_wait: Duration::ZERO,
            lend_above: 128 * 1024,
            coalesce: Duration::ZERO,
            local: false,
            busy_poll_us: 0,
        }
    }
}

impl Config {
    /// This config with every field clamped into its legal range.
    pub fn normalized(&self) -> Config {
        Config {
            bufs: self.bufs.max(MIN_BUFS),
            max_bufs: self.max_bufs,
            buf_size: self.buf_size.clamp(MIN_BUF_SIZE, MAX_SIZE),
            desired_remote_buf_size: self.desired_remote_buf_size.clamp(MIN_BUF_SIZE, MAX_SIZE),
            max_adverts: self.max_adverts.max(1),
            ird: self.ird.max(1),
            ord: self.ord.max(1),
            send_buffer: self.send_buffer.max(1),
            oob_inline: self.oob_inline,
            close_timeout: self.close_timeout,
            // §10 constraint 5: "The Data Sink Bcopy Threshold MUST be
            // greater than or equal to the size of the Local Peer's receive
            // Private Buffers."
            bcopy_threshold: self
                .bcopy_threshold
                .max(u64::from(self.buf_size.clamp(MIN_BUF_SIZE, MAX_SIZE))),
            read_zcopy: self.read_zcopy,
            write_zcopy: self.write_zcopy,
            pipelining: self.pipelining,
            req_pipe: self.req_pipe,
            buffered_after_send_sm: self.buffered_after_send_sm,
            sink_avail_wait: self.sink_avail_wait,
            lend_above: self.lend_above,
            coalesce: self.coalesce,
            local: self.local,
            busy_poll_us: self.busy_poll_us,
        }
    }
}

impl Config {
    /// This config with the socket buffer sizes a program chose (SO_RCVBUF,
    /// SO_SNDBUF, in bytes as the kernel reports them): a program that
    /// makes its buffers small relies on flow control reaching it early —
    /// a sender blocked, or still sending when the peer goes away — so
    /// SDP must not buffer megabytes behind its back. The receive Private
    /// Buffers then hold about `rcvbuf` in all: fewer buffers first, then
    /// smaller ones, never below §10's minimums ([`MIN_BUFS`] buffers of
    /// [`MIN_BUF_SIZE`]), and the pool does not grow (`max_bufs`); the
    /// send buffer holds at most `sndbuf`. `None` or a larger value leaves
    /// the field as it is.
    pub fn with_socket_buffers(&self, rcvbuf: Option<u64>, sndbuf: Option<u64>) -> Config {
        let mut c = self.normalized();
        if let Some(window) = rcvbuf {
            let size = u64::from(c.buf_size);
            let fit = window / size;
            if fit >= u64::from(MIN_BUFS) {
                c.bufs = c.bufs.min(u16::try_from(fit).unwrap_or(u16::MAX));
            } else {
                c.bufs = MIN_BUFS;
                let each = (window / u64::from(MIN_BUFS)).clamp(u64::from(MIN_BUF_SIZE), size);
                c.buf_size = each as u32;
            }
            // A size the program set is the size: Linux stops autotuning
            // a socket whose SO_RCVBUF was set.
            c.max_bufs = c.max_bufs.min(c.bufs);
        }
        if let Some(bytes) = sndbuf {
            c.send_buffer = c.send_buffer.min(bytes.max(1));
        }
        c
    }
}

/// What setup learned about the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerParams {
    /// Initial Bufs: the peer's receive Private Buffers posted.
    pub bufs: u16,
    /// Size of the peer's receive Private Buffers: the largest message we
    /// may send (§10 constraint 3).
    pub rcv_size: u32,
    /// The peer's MaxAdverts.
    pub max_adverts: u16,
    /// The peer's LocIRD.
    pub ird: u16,
    /// The peer's LocORD.
    pub ord: u16,
    /// The peer's MinV.
    pub min_v: u8,
    /// The peer speaks the same-host extension (bit 0 of its Rsvd byte,
    /// [`crate::wire::LOCAL_BIT`]).
    pub local: bool,
}

/// The Hello Message of a Connecting Peer with `config` (§6.2.1, §8.1.1
/// steps 1–2), to travel as the MPA Request's private data.
pub fn hello_message(config: &Config) -> [u8; HELLO_MSG_LEN] {
    let repr = MessageRepr {
        // §8.1.1 step 1c: the buffers advertised are posted before the
        // Hello goes.
        bufs: config.bufs,
        // §6.2.1: "Flags = 0x0", "MSeq = set to zero", "MSeqAck = set to
        // zero".
        flags: Flags::EMPTY,
        mseq: 0,
        mseq_ack: 0,
        body: Body::Hello(HelloRepr {
            // §6.2.1.1, §6.2.1.2: MajV 1, MinV 1.
            maj_v: MAJOR_VERSION,
            min_v: MINOR_VERSION,
            max_adverts: config.max_adverts,
            des_rem_rcv_sz: config.desired_remote_buf_size,
            local_rcv_sz: config.buf_size,
            // §8.1.1 step 1d: "greater than or equal to one and less than
            // or equal to the local IRD and local ORD".
            loc_ird: config.ird,
            loc_ord: config.ord,
        }),
    };
    let mut out = [0; HELLO_MSG_LEN];
    repr.emit(&mut out);
    if config.local {
        out[RSVD_AT] |= wire::LOCAL_BIT;
    }
    out
}

/// Where the Rsvd byte of a Hello or HelloAck message is: right after the
/// version byte of the HH or HAH (§6.2.1.8, §6.2.2.7).
pub(crate) const RSVD_AT: usize = wire::BSDH_LEN + 1;

/// The HelloAck of an Accepting Peer (§6.2.2, §8.1.1 step 4), with the
/// IRD and ORD after adjustment.
pub fn hello_ack_repr(config: &Config, ird: u16, ord: u16) -> HelloAckRepr {
    HelloAckRepr {
        maj_v: MAJOR_VERSION,
        min_v: MINOR_VERSION,
        max_adverts: config.max_adverts,
        act_rcv_sz: config.buf_size,
        loc_ird: ird,
        loc_ord: ord,
    }
}

/// Common checks of the Bufs and receive size the peer announced.
fn check_peer(bufs: u16, rcv_size: u32) -> Result<(), Violation> {
    // §10.3: initial Bufs ≥ 3.
    if bufs < MIN_BUFS {
        return Err(Violation::TooFewBufs(bufs));
    }
    // §10 constraint 4: buffers hold at least BSDH + SinkAH + 1 bytes.
    if rcv_size < MIN_BUF_SIZE {
        return Err(Violation::BufferTooSmall(rcv_size));
    }
    Ok(())
}

/// The Accepting Peer's checks of a Hello (§8.1.1 step 3a): MajV, MaxAdverts
/// ≠ 0, LocIRD/LocORD ≠ 0 ([`HelloRepr::validate`]), initial Bufs ≥ 3 and a
/// receive size of at least [`MIN_BUF_SIZE`]. A MinV mismatch is accepted
/// (step 3b: "SHOULD NOT reject the connection request based solely on a
/// mismatch of the Minor Protocol Version Number").
pub fn check_hello(bytes: &[u8]) -> Result<PeerParams, Violation> {
    let msg = MessageRepr::parse(bytes)?;
    let Body::Hello(hh) = msg.body else {
        return Err(Violation::UnexpectedMessage(msg.body.mid()));
    };
    msg.validate()?;
    check_peer(msg.bufs, hh.local_rcv_sz)?;
    Ok(PeerParams {
        bufs: msg.bufs,
        rcv_size: hh.local_rcv_sz,
        max_adverts: hh.max_adverts,
        ird: hh.loc_ird,
        ord: hh.loc_ord,
        min_v: hh.min_v,
        local: bytes.get(RSVD_AT).is_some_and(|b| b & wire::LOCAL_BIT != 0),
    })
}

/// The Connecting Peer's checks of a HelloAck (§8.1.1 step 7a), given
/// already parsed.
pub fn check_hello_ack(msg: &MessageRepr<'_>) -> Result<PeerParams, Violation> {
    let Body::HelloAck(hah) = msg.body else {
        return Err(Violation::UnexpectedMessage(msg.body.mid()));
    };
    msg.validate()?;
    check_peer(msg.bufs, hah.act_rcv_sz)?;
    Ok(PeerParams {
        bufs: msg.bufs,
        rcv_size: hah.act_rcv_sz,
        max_adverts: hah.max_adverts,
        ird: hah.loc_ird,
        ord: hah.loc_ord,
        min_v: hah.min_v,
        // Read from the raw bytes by the caller (Conn::parse).
        local: false,
    })
}

/// IRD and ORD after the peer's LocIRD/LocORD (§8.1.1 steps 4d–4e and
/// 7c–7d): our IRD may drop to the peer's LocORD (we do: the peer never
/// issues more Reads than that), and our ORD MUST drop to at most the
/// peer's LocIRD.
pub fn adjust_ird_ord(config: &Config, peer: &PeerParams) -> (u16, u16) {
    let ird = config.ird.min(peer.ord).max(1);
    let ord = config.ord.min(peer.ird).max(1);
    (ird, ord)
}

/// The minor version in use: "the minimum of the locally supported Minor
/// Protocol Version Number and the value of the MinV field received"
/// (§8.1.1 steps 3b and 7b).
pub fn minor_version(peer: &PeerParams) -> u8 {
    peer.min_v.min(MINOR_VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Mid;

    fn hello_with(f: impl FnOnce(&mut HelloRepr, &mut u16)) -> Vec<u8> {
        let config = Config::default();
        let bytes = hello_message(&config);
        let msg = MessageRepr::parse(&bytes).unwrap();
        let Body::Hello(mut hh) = msg.body else {
            unreachable!()
        };
        let mut bufs = msg.bufs;
        f(&mut hh, &mut bufs);
        let repr = MessageRepr {
            bufs,
            body: Body::Hello(hh),
            ..msg
        };
        let mut out = vec![0; repr.buffer_len()];
        repr.emit(&mut out);
        out
    }

    /// A program's SO_RCVBUF bounds the pool's growth as it bounds its
    /// start; without one the pool may grow.
    #[test]
    fn a_set_receive_buffer_keeps_the_pool_from_growing() {
        let c = Config {
            max_bufs: 64,
            ..Config::default()
        };
        let small = c.with_socket_buffers(Some(256 * 1024), None);
        assert_eq!((small.bufs, small.max_bufs), (4, 4));
        let tiny = c.with_socket_buffers(Some(4096), None);
        assert_eq!((tiny.bufs, tiny.max_bufs), (MIN_BUFS, MIN_BUFS));
        let unset = c.with_socket_buffers(None, Some(4096));
        assert_eq!((unset.bufs, unset.max_bufs), (16, 64));
    }

    #[test]
    fn hello_bytes() {
        let config = Config {
            bufs: 8,
            buf_size: 0x8000,
            desired_remote_buf_size: 0x1_0000,
            max_adverts: 16,
            ird: 4,
            ord: 8,
            ..Config::default()
        };
        assert_eq!(
            hello_message(&config),
            [
                0x00, 0x00, 0x00, 0x08, // MID Hello, Flags 0, Bufs 8
                0x00, 0x00, 0x00, 0x20, // Len 32
                0x00, 0x00, 0x00, 0x00, // MSeq 0
                0x00, 0x00, 0x00, 0x00, // MSeqAck 0
                0x11, 0x00, 0x00, 0x10, // MajV 1 MinV 1, Rsvd, MaxAdverts 16
                0x00, 0x01, 0x00, 0x00, // DesRemRcvSz
                0x00, 0x00, 0x80, 0x00, // LocalRcvSz
                0x00, 0x08, 0x00, 0x04, // LocORD 8, LocIRD 4
            ]
        );
    }

    #[test]
    fn accept_reject_matrix() {
        assert!(check_hello(&hello_with(|_, _| {})).is_ok());
        // MinV mismatch tolerated; the minimum is used.
        let peer = check_hello(&hello_with(|h, _| h.min_v = 7)).unwrap();
        assert_eq!(minor_version(&peer), 1);
        let peer = check_hello(&hello_with(|h, _| h.min_v = 0)).unwrap();
        assert_eq!(minor_version(&peer), 0);
        let cases: [(Vec<u8>, Violation); 7] = [
            (
                hello_with(|h, _| h.maj_v = 2),
                Violation::Malformed(wire::Error::UnsupportedMajorVersion),
            ),
            (
                hello_with(|h, _| h.max_adverts = 0),
                Violation::Malformed(wire::Error::ZeroMaxAdverts),
            ),
            (
                hello_with(|h, _| h.loc_ird = 0),
                Violation::Malformed(wire::Error::ZeroLocIrd),
            ),
            (
                hello_with(|h, _| h.loc_ord = 0),
                Violation::Malformed(wire::Error::ZeroLocOrd),
            ),
            (hello_with(|_, b| *b = 2), Violation::TooFewBufs(2)),
            (
                hello_with(|h, _| h.local_rcv_sz = 36),
                Violation::BufferTooSmall(36),
            ),
            (
                vec![0xff, 0, 0, 3, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0],
                Violation::UnexpectedMessage(Mid::DATA),
            ),
        ];
        for (bytes, violation) in cases {
            assert_eq!(check_hello(&bytes), Err(violation));
        }
        assert_eq!(
            check_hello(&hello_message(&Config::default())[..20]),
            Err(Violation::Malformed(wire::Error::Truncated))
        );
    }

    #[test]
    fn ird_ord_adjustment() {
        let config = Config {
            ird: 8,
            ord: 8,
            ..Config::default()
        };
        let peer = PeerParams {
            bufs: 4,
            rcv_size: 4096,
            max_adverts: 1,
            ird: 2,
            ord: 3,
            min_v: 1,
            local: false,
        };
        // IRD down to the peer's ORD, ORD down to the peer's IRD.
        assert_eq!(adjust_ird_ord(&config, &peer), (3, 2));
        let small = Config {
            ird: 1,
            ord: 1,
            ..Config::default()
        };
        assert_eq!(adjust_ird_ord(&small, &peer), (1, 1));
    }

    #[test]
    fn config_is_clamped() {
        let c = Config {
            bufs: 0,
            buf_size: 1,
            max_adverts: 0,
            ird: 0,
            ord: 0,
            ..Config::default()
        }
        .normalized();
        assert_eq!(
            (c.bufs, c.buf_size, c.max_adverts, c.ird, c.ord),
            (3, 37, 1, 1, 1)
        );
    }
}
