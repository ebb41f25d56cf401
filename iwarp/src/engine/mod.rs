//! The iWARP data path: RDMAP (RFC 5040) over DDP (RFC 5041) over MPA
//! FPDUs (RFC 5044), as a sans-IO queue pair.
//!
//! * [`DataPath`] — one stream's queue pair: send, receive and completion
//!   queues, the registration table ([`crate::mem`]), segmentation and
//!   framing on transmit, deframing, validation and placement on receive,
//!   the ordering and completion rules of RFC 5040 §5.5, IRD/ORD (§6.1),
//!   Terminate generation and reception (§4.8, §5.4, §7).
//! * [`Connection`] — MPA startup ([`crate::mpa::startup`]) followed by the
//!   data path, with the RTR of RFC 6581.
//!
//! Nothing here does I/O, reads a clock or allocates per FPDU in steady
//! state. Transmit output is a gather list ([`TxQueue`]): engine-made
//! octets plus references into [`crate::mem::Memory`], for `writev`.
//! Receive input is either copied into place
//! ([`DataPath::handle_input`]) or received straight into place by the
//! driver ([`DataPath::recv_target`], [`DataPath::placed`]), with the CRC
//! computed over the octets where they land.
//!
//! ```
//! use iwarp::engine::{DataPath, Params, Payload, RecvWr, SendKind, SendWr, Sge};
//! use iwarp::mem::{Memory, Pd, VecMemory};
//!
//! let (mut a, mut b) = (DataPath::new(Pd(1), 1), DataPath::new(Pd(1), 2));
//! a.enable(Params::default());
//! b.enable(Params::default());
//! let (mut ma, mut mb) = (VecMemory::new(), VecMemory::new());
//! let src = ma.add(b"hello".to_vec());
//! let dst = mb.add(vec![0; 16]);
//!
//! b.post_recv(RecvWr { wr_id: 7, sge: Sge { region: dst, offset: 0, len: 16 } }).unwrap();
//! a.post_send(SendWr {
//!     wr_id: 1,
//!     kind: SendKind::Send,
//!     payload: Payload::region(src, 0, 5),
//!     signaled: true,
//! })
//! .unwrap();
//!
//! // Move the bytes: gather list out of `a`, into `b`.
//! a.poll_transmit(&ma, 1 << 20);
//! let mut wire = Vec::new();
//! a.txq().for_each_slice(&ma, |s| { wire.extend_from_slice(s); true }).unwrap();
//! a.tx_advance(wire.len());
//! b.handle_input(&wire, &mut mb);
//!
//! assert!(a.poll_completion().unwrap().status.is_success());
//! let c = b.poll_completion().unwrap();
//! assert_eq!((c.wr_id, c.byte_len), (7, 5));
//! assert_eq!(&mb.region(dst).unwrap()[..5], b"hello");
//! ```

mod connection;
pub mod overlay;
mod placement;
mod qp;
pub mod rebase;
mod rx;
mod sink;
mod terminate;
mod tx;
mod txq;
mod wr;

pub use connection::{Connection, ConnectionConfig, Role};
pub use overlay::RecvOverlay;
pub use qp::{DataPath, Params, RecvTarget, RtrKind, RtrRole, State, RTR_STAG};
pub use rebase::Rebase;
pub use txq::{MissingRegion, TxChunk, TxQueue};
pub use wr::{
    Completion, Event, Payload, PostError, ReadWr, RecvWr, SendKind, SendWr, Sge, Status,
    TerminateInfo, WcOpcode, WriteWr,
};
