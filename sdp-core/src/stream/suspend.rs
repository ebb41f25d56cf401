//! Test-only: a stream as the Local Peer of a socket duplication (draft
//! §13.1.1 step 2), to test the Remote Peer's side over real sockets. The
//! hand-over to another address space (step 5) is the test's business.

use std::time::Instant;

use super::SdpStream;

impl SdpStream {
    /// Sends a SuspComm for `port` once nothing is In-Process (see
    /// [`Conn::request_suspend`](crate::conn::Conn::request_suspend)):
    /// after it the stream sends nothing; reads return what arrived until
    /// the peer closes the old TCP connection, then 0.
    pub fn request_suspend(&self, port: u16) {
        let mut g = self.shared().lock();
        g.link.conn_mut().request_suspend(port);
        g.pump_out(Instant::now());
    }

    /// The peer's SuspCommAck arrived.
    pub fn susp_comm_acked(&self) -> bool {
        self.shared().lock().link.conn().susp_comm_acked()
    }
}
