//! ChRcvBuf and ChRcvBufAck: the peer's receive Private Buffer size
//! changed at our request (draft §10.6).

use super::{setup, Conn, Control, State, Violation};
use crate::errno::Error;
use crate::wire::Mid;

/// Our ChRcvBuf (§10.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Resize {
    /// Size asked for, unacknowledged.
    pub(super) asked: Option<u32>,
    /// A smaller size in use at once (§10.6: "MUST begin using the smaller
    /// size immediately after sending").
    pub(super) smaller: Option<u32>,
    pub(super) no_more_increase: bool,
    pub(super) no_more_decrease: bool,
}

impl Conn {
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
    pub(super) fn on_ch_rcv_buf_ack(&mut self, act_sz: u32) {
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
}
