//! The port mapper message (draft-pinkerton-iwarp-sdp-01 §7.3, Figure 17).
//!
//! Sections implemented here: §7.3 (the single 48-byte format), §7.3.1.1
//! (Ver), §7.3.1.2 (MT), §7.3.1.3 (IPV and the placement of IPv4 addresses),
//! §7.3.1.4 (PmTime encoding, see [`pm_time`]), §7.3.1.5 (Reserved) and
//! §7.3.1.6–§7.3.1.10 (ports, AssocHandle, addresses). The exchange rules of
//! §7.4/§7.5 belong to the client and server state machines.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! |Ver|MT |  IPV  |  PmTime       |     Reserved                  |
//! |            ApPort             |            CpPort             |
//! |                    AssocHandle (64 bits)                      |
//! |                    CpIPAddr (128 bits)                        |
//! |                    ApIPAddr (128 bits)                        |
//! ```
//!
//! What a datagram must satisfy to be a port mapper message, and the error
//! each failure gives (a receiver drops such datagrams and never answers):
//!
//! * exactly [`MESSAGE_LEN`] bytes: shorter is [`Error::Truncated`], longer is
//!   [`Error::TooLong`] ("All Port Mapper messages MUST have the format
//!   defined in Figure 17", §7.3 — the format has no length field and no
//!   room for trailing data);
//! * Ver = 0, else [`Error::BadVersion`] (§7.3.1.1);
//! * IPV = 4 or 6, else [`Error::ReservedIpVersion`] (§7.3.1.3): the address
//!   fields cannot be read without it.
//!
//! MT has no reserved values: §7.3.1.2 assigns all four 2-bit codes, so every
//! MT parses as a [`MsgType`].
//!
//! Fields "ignored on receive" are left out of [`MessageRepr`] or normalised
//! by [`MessageRepr::parse`], and emitted as zero by [`MessageRepr::emit`]:
//! Reserved (§7.3.1.5), the trailing 96 bits of IPv4 addresses (§7.3.1.3)
//! and PmTime in every message but PMAccept (§7.4).
//!
//! # Example
//!
//! ```
//! use portmapper::wire::{Message, MessageRepr, MsgType, PmTime, MESSAGE_LEN};
//! use std::net::{IpAddr, Ipv4Addr};
//!
//! let req = MessageRepr {
//!     mtype: MsgType::REQ,
//!     pm_time: PmTime::NO_CACHE,
//!     ap_port: 5001,
//!     cp_port: 40000,
//!     assoc_handle: 0x0123_4567_89ab_cdef,
//!     cp_addr: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
//!     ap_addr: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
//! };
//! let mut buf = [0u8; MESSAGE_LEN];
//! req.emit(&mut Message::new_unchecked(&mut buf[..]));
//! assert_eq!(buf[0], 0x04); // Ver 0, MT PMReq, IPV 4
//!
//! let msg = Message::new_checked(&buf[..]).unwrap();
//! assert_eq!(MessageRepr::parse(&msg).unwrap(), req);
//! ```

use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// Length of every port mapper message (§7.3, Figure 17).
pub const MESSAGE_LEN: usize = field::AP_IP_ADDR.end;

/// The port mapper's UDP port: "The Port Mapper Service by default MUST use
/// UDP Port 3935." (§16)
pub const DEFAULT_PORT: u16 = 3935;

/// A decode error. Each variant is one reason a datagram is not a port
/// mapper message.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// Fewer than [`MESSAGE_LEN`] bytes.
    Truncated,
    /// More than [`MESSAGE_LEN`] bytes.
    TooLong,
    /// Ver is not 0 (§7.3.1.1).
    BadVersion,
    /// IPV is neither 4 nor 6 (§7.3.1.3).
    ReservedIpVersion,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "port mapper message shorter than 48 bytes",
            Error::TooLong => "port mapper message longer than 48 bytes",
            Error::BadVersion => "port mapper message with Ver other than 0",
            Error::ReservedIpVersion => "port mapper message with reserved IPV",
        })
    }
}

impl std::error::Error for Error {}

/// Message Type, MT (§7.3.1.2). 2 bits; all four values are assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsgType(pub u8);

impl MsgType {
    /// Port Mapper Request Message (PMReq).
    pub const REQ: MsgType = MsgType(0x0);
    /// Port Mapper Accept Message (PMAccept).
    pub const ACCEPT: MsgType = MsgType(0x1);
    /// Port Mapper Acknowledgement Message (PMAck).
    pub const ACK: MsgType = MsgType(0x2);
    /// Port Mapper Deny Message (PMDeny).
    pub const DENY: MsgType = MsgType(0x3);

    /// The draft's name for this type ("PMReq", ...), or "reserved" for a
    /// value that does not fit in 2 bits.
    pub fn name(self) -> &'static str {
        match self {
            MsgType::REQ => "PMReq",
            MsgType::ACCEPT => "PMAccept",
            MsgType::ACK => "PMAck",
            MsgType::DENY => "PMDeny",
            _ => "reserved",
        }
    }
}

impl fmt::Display for MsgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// IP Version, IPV (§7.3.1.3). 4 bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpVersion(pub u8);

impl IpVersion {
    /// IPv4: only the first 32 bits of each address field are valid.
    pub const V4: IpVersion = IpVersion(0x4);
    /// IPv6: all 128 bits of each address field are valid.
    pub const V6: IpVersion = IpVersion(0x6);
}

impl fmt::Display for IpVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IpVersion::V4 => f.write_str("IPv4"),
            IpVersion::V6 => f.write_str("IPv6"),
            IpVersion(v) => write!(f, "reserved IPV {v}"),
        }
    }
}

/// The PmTime encoding of §7.3.1.4: how long the Connecting Peer may cache a
/// PMAccept's answer.
///
/// | code      | meaning                                   |
/// |-----------|-------------------------------------------|
/// | 0         | single connection, MUST NOT cache         |
/// | 1..=127   | code × 250 ms  (250 ms ..= 31.75 s)       |
/// | 128..=254 | code × 1000 ms (128 s ..= 254 s)          |
/// | 255       | may cache permanently                     |
///
/// Note the gap: nothing encodes a time between 31.75 s and 128 s.
pub mod pm_time {
    use std::time::Duration;

    /// The duration [`decode`] gives for 255 ("permanently").
    pub const PERMANENT: Duration = Duration::MAX;

    /// The code for `d`: the longest caching time that does not exceed `d`,
    /// so an encoded policy never lets a client cache longer than intended.
    /// Only [`PERMANENT`] (`Duration::MAX`) encodes as 255; anything below
    /// 250 ms encodes as 0 (no caching).
    pub fn encode(d: Duration) -> u8 {
        if d == PERMANENT {
            return 255;
        }
        let ms = d.as_millis();
        if ms >= 128_000 {
            // [128, 254]: PmTime * 1000 ms; finite times past 254 s saturate
            // at 254 because 255 would mean "forever".
            (ms / 1000).min(254) as u8
        } else {
            // [1, 127]: PmTime * 250 ms; 31.75 s..128 s falls in the gap and
            // rounds down to 127.
            (ms / 250).min(127) as u8
        }
    }

    /// The caching time a code allows: `Duration::ZERO` for 0 (use once, do
    /// not cache), [`PERMANENT`] for 255.
    pub fn decode(code: u8) -> Duration {
        match code {
            0 => Duration::ZERO,
            1..=127 => Duration::from_millis(u64::from(code) * 250),
            128..=254 => Duration::from_millis(u64::from(code) * 1000),
            255 => PERMANENT,
        }
    }
}

/// PmTime (§7.3.1.4), the raw 8-bit code; see [`pm_time`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PmTime(pub u8);

impl PmTime {
    /// 0: use for a single connection, MUST NOT cache. Also the value of
    /// PmTime in PMReq, PMAck and PMDeny.
    pub const NO_CACHE: PmTime = PmTime(0);
    /// 255: may cache permanently.
    pub const PERMANENT: PmTime = PmTime(255);

    /// Encode a caching time, rounding down (see [`pm_time::encode`]).
    pub fn from_duration(d: Duration) -> PmTime {
        PmTime(pm_time::encode(d))
    }

    /// The caching time this code allows (see [`pm_time::decode`]).
    pub fn duration(self) -> Duration {
        pm_time::decode(self.0)
    }
}

mod field {
    use core::ops::Range;

    /// Ver (bits 7..6), MT (bits 5..4), IPV (bits 3..0).
    pub const VER_MT_IPV: usize = 0;
    pub const PM_TIME: usize = 1;
    pub const RESERVED: Range<usize> = 2..4;
    pub const AP_PORT: Range<usize> = 4..6;
    pub const CP_PORT: Range<usize> = 6..8;
    pub const ASSOC_HANDLE: Range<usize> = 8..16;
    pub const CP_IP_ADDR: Range<usize> = 16..32;
    pub const AP_IP_ADDR: Range<usize> = 32..48;
}

/// A read/write view of a port mapper message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message<T: AsRef<[u8]>> {
    buffer: T,
}

fn be16(b: &[u8]) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(b);
    u16::from_be_bytes(a)
}

impl<T: AsRef<[u8]>> Message<T> {
    /// Wrap a buffer without checking its length. Accessors panic if it is
    /// shorter than [`MESSAGE_LEN`]; use [`Message::new_checked`] for input.
    pub const fn new_unchecked(buffer: T) -> Message<T> {
        Message { buffer }
    }

    /// Wrap a received datagram, checking that it is exactly one message.
    pub fn new_checked(buffer: T) -> Result<Message<T>, Error> {
        let m = Self::new_unchecked(buffer);
        m.check_len()?;
        Ok(m)
    }

    /// Check that the buffer is exactly [`MESSAGE_LEN`] bytes: the datagram
    /// is the message, and Figure 17 leaves room for nothing else.
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < MESSAGE_LEN {
            Err(Error::Truncated)
        } else if len > MESSAGE_LEN {
            Err(Error::TooLong)
        } else {
            Ok(())
        }
    }

    /// Give back the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Ver, 2 bits.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_MT_IPV] >> 6
    }

    /// MT, 2 bits.
    pub fn msg_type(&self) -> MsgType {
        MsgType((self.buffer.as_ref()[field::VER_MT_IPV] >> 4) & 0x3)
    }

    /// IPV, 4 bits.
    pub fn ip_version(&self) -> IpVersion {
        IpVersion(self.buffer.as_ref()[field::VER_MT_IPV] & 0xf)
    }

    /// PmTime, 8 bits.
    pub fn pm_time(&self) -> PmTime {
        PmTime(self.buffer.as_ref()[field::PM_TIME])
    }

    /// Reserved, 16 bits ("MUST NOT be checked by the receiver", §7.3.1.5).
    pub fn reserved(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::RESERVED])
    }

    /// ApPort.
    pub fn ap_port(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::AP_PORT])
    }

    /// CpPort.
    pub fn cp_port(&self) -> u16 {
        be16(&self.buffer.as_ref()[field::CP_PORT])
    }

    /// AssocHandle (opaque; big-endian here so that it prints as on the wire).
    pub fn assoc_handle(&self) -> u64 {
        let mut a = [0u8; 8];
        a.copy_from_slice(&self.buffer.as_ref()[field::ASSOC_HANDLE]);
        u64::from_be_bytes(a)
    }

    /// CpIPAddr, all 128 bits as transmitted.
    pub fn cp_ip_addr(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::CP_IP_ADDR]);
        a
    }

    /// ApIPAddr, all 128 bits as transmitted.
    pub fn ap_ip_addr(&self) -> [u8; 16] {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::AP_IP_ADDR]);
        a
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Message<T> {
    /// Set Ver (low 2 bits of `v`).
    pub fn set_version(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::VER_MT_IPV];
        *b = (*b & 0x3f) | ((v & 0x3) << 6);
    }

    /// Set MT (low 2 bits).
    pub fn set_msg_type(&mut self, t: MsgType) {
        let b = &mut self.buffer.as_mut()[field::VER_MT_IPV];
        *b = (*b & 0xcf) | ((t.0 & 0x3) << 4);
    }

    /// Set IPV (low 4 bits).
    pub fn set_ip_version(&mut self, v: IpVersion) {
        let b = &mut self.buffer.as_mut()[field::VER_MT_IPV];
        *b = (*b & 0xf0) | (v.0 & 0xf);
    }

    /// Set PmTime.
    pub fn set_pm_time(&mut self, t: PmTime) {
        self.buffer.as_mut()[field::PM_TIME] = t.0;
    }

    /// Set Reserved.
    pub fn set_reserved(&mut self, v: u16) {
        self.buffer.as_mut()[field::RESERVED].copy_from_slice(&v.to_be_bytes());
    }

    /// Set ApPort.
    pub fn set_ap_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::AP_PORT].copy_from_slice(&v.to_be_bytes());
    }

    /// Set CpPort.
    pub fn set_cp_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::CP_PORT].copy_from_slice(&v.to_be_bytes());
    }

    /// Set AssocHandle.
    pub fn set_assoc_handle(&mut self, v: u64) {
        self.buffer.as_mut()[field::ASSOC_HANDLE].copy_from_slice(&v.to_be_bytes());
    }

    /// Set CpIPAddr (all 128 bits).
    pub fn set_cp_ip_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::CP_IP_ADDR].copy_from_slice(&a);
    }

    /// Set ApIPAddr (all 128 bits).
    pub fn set_ap_ip_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::AP_IP_ADDR].copy_from_slice(&a);
    }
}

/// A parsed port mapper message.
///
/// Both addresses are of the family IPV names. [`MessageRepr::emit`] writes
/// IPV 4 when both are IPv4 and IPV 6 otherwise (an IPv4 address in an IPV 6
/// message is written IPv4-mapped, `::ffff:a.b.c.d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageRepr {
    /// MT.
    pub mtype: MsgType,
    /// PmTime; meaningful only in PMAccept. [`MessageRepr::parse`] gives
    /// [`PmTime::NO_CACHE`] for the other types and `emit` writes 0 there.
    pub pm_time: PmTime,
    /// ApPort: the requested port (PMReq), the SDP listen port (PMAccept,
    /// PMAck). For PMDeny §7.3.1.6 says "undefined ... transmitted as zeroes
    /// and ignored on receive" while §7.4 says "the same value as the ApPort
    /// field in the corresponding PMReq"; the codec carries the value as is.
    pub ap_port: u16,
    /// CpPort.
    pub cp_port: u16,
    /// AssocHandle.
    pub assoc_handle: u64,
    /// CpIPAddr.
    pub cp_addr: IpAddr,
    /// ApIPAddr.
    pub ap_addr: IpAddr,
}

fn v4_from_field(a: [u8; 16]) -> Ipv4Addr {
    // §7.3.1.3: "only the first 32-bits, in network byte order, ... are
    // valid. The remaining 96 bits are ... ignored on receipt."
    Ipv4Addr::new(a[0], a[1], a[2], a[3])
}

fn v4_to_field(a: Ipv4Addr) -> [u8; 16] {
    // §7.3.1.3: "The remaining 96 bits are transmitted as zeroes".
    let mut f = [0u8; 16];
    f[..4].copy_from_slice(&a.octets());
    f
}

fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

impl MessageRepr {
    /// Parse a checked message. Rejects Ver ≠ 0 and reserved IPV.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(msg: &Message<&T>) -> Result<MessageRepr, Error> {
        // §7.3.1.1: "For this version of the specification, Ver MUST be set
        // to zero." Another version may lay the message out differently.
        if msg.version() != 0 {
            return Err(Error::BadVersion);
        }
        // §7.3.1.3: "Only 0x4 and 0x6 are valid values for IPV ... All other
        // values are reserved."
        let (cp_addr, ap_addr) = match msg.ip_version() {
            IpVersion::V4 => (
                IpAddr::V4(v4_from_field(msg.cp_ip_addr())),
                IpAddr::V4(v4_from_field(msg.ap_ip_addr())),
            ),
            IpVersion::V6 => (
                IpAddr::V6(Ipv6Addr::from(msg.cp_ip_addr())),
                IpAddr::V6(Ipv6Addr::from(msg.ap_ip_addr())),
            ),
            _ => return Err(Error::ReservedIpVersion),
        };
        let mtype = msg.msg_type();
        // §7.4: in PMReq, PMAck and PMDeny "PmTime - MUST be set to zero and
        // ignored on receive."
        let pm_time = if mtype == MsgType::ACCEPT {
            msg.pm_time()
        } else {
            PmTime::NO_CACHE
        };
        Ok(MessageRepr {
            mtype,
            pm_time,
            ap_port: msg.ap_port(),
            cp_port: msg.cp_port(),
            assoc_handle: msg.assoc_handle(),
            cp_addr,
            ap_addr,
        })
    }

    /// Parse a received datagram: [`Message::new_checked`] then
    /// [`MessageRepr::parse`].
    pub fn parse_bytes(datagram: &[u8]) -> Result<MessageRepr, Error> {
        MessageRepr::parse(&Message::new_checked(datagram)?)
    }

    /// The IPV this message is emitted with.
    pub fn ip_version(&self) -> IpVersion {
        match (self.cp_addr, self.ap_addr) {
            (IpAddr::V4(_), IpAddr::V4(_)) => IpVersion::V4,
            _ => IpVersion::V6,
        }
    }

    /// Always [`MESSAGE_LEN`].
    pub const fn buffer_len(&self) -> usize {
        MESSAGE_LEN
    }

    /// Write the message into a view of at least [`MESSAGE_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, msg: &mut Message<&mut T>) {
        let ipv = self.ip_version();
        msg.set_version(0);
        msg.set_msg_type(self.mtype);
        msg.set_ip_version(ipv);
        msg.set_pm_time(if self.mtype == MsgType::ACCEPT {
            self.pm_time
        } else {
            PmTime::NO_CACHE
        });
        // §7.3.1.5: "Reserved MUST be transmitted as zero by the sender".
        msg.set_reserved(0);
        msg.set_ap_port(self.ap_port);
        msg.set_cp_port(self.cp_port);
        msg.set_assoc_handle(self.assoc_handle);
        let (cp, ap) = match (self.cp_addr, self.ap_addr) {
            (IpAddr::V4(cp), IpAddr::V4(ap)) => (v4_to_field(cp), v4_to_field(ap)),
            (cp, ap) => (v6_octets(cp), v6_octets(ap)),
        };
        msg.set_cp_ip_addr(cp);
        msg.set_ap_ip_addr(ap);
    }

    /// Emit into a fresh array.
    pub fn to_bytes(&self) -> [u8; MESSAGE_LEN] {
        let mut buf = [0u8; MESSAGE_LEN];
        self.emit(&mut Message::new_unchecked(&mut buf[..]));
        buf
    }
}

impl fmt::Display for MessageRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} handle={:#018x} cp={}:{} ap={}:{}",
            self.mtype, self.assoc_handle, self.cp_addr, self.cp_port, self.ap_addr, self.ap_port
        )?;
        if self.mtype == MsgType::ACCEPT {
            write!(f, " pm_time={}", self.pm_time.0)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // PMAccept, IPV 4, PmTime 8 (2 s), reserved 0, ApPort 0x1389 (5001),
    // CpPort 0x9c40 (40000), AssocHandle 0x0123456789abcdef,
    // CpIPAddr 192.0.2.1, ApIPAddr 198.51.100.7.
    static V4_ACCEPT: [u8; 48] = [
        0x14, 0x08, 0x00, 0x00, 0x13, 0x89, 0x9c, 0x40, //
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, //
        0xc0, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
        0xc6, 0x33, 0x64, 0x07, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, //
    ];

    fn v4_accept_repr() -> MessageRepr {
        MessageRepr {
            mtype: MsgType::ACCEPT,
            pm_time: PmTime(8),
            ap_port: 5001,
            cp_port: 40000,
            assoc_handle: 0x0123_4567_89ab_cdef,
            cp_addr: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            ap_addr: IpAddr::V4(Ipv4Addr::new(198, 51, 100, 7)),
        }
    }

    // PMReq, IPV 6, ApPort 22 (0x0016), CpPort 0xfffe, AssocHandle
    // 0xfedcba9876543210, CpIPAddr 2001:db8::1, ApIPAddr 2001:db8::2:3.
    static V6_REQ: [u8; 48] = [
        0x06, 0x00, 0x00, 0x00, 0x00, 0x16, 0xff, 0xfe, //
        0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32, 0x10, //
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, //
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, //
        0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x03, //
    ];

    fn v6_req_repr() -> MessageRepr {
        MessageRepr {
            mtype: MsgType::REQ,
            pm_time: PmTime::NO_CACHE,
            ap_port: 22,
            cp_port: 0xfffe,
            assoc_handle: 0xfedc_ba98_7654_3210,
            cp_addr: "2001:db8::1".parse().unwrap(),
            ap_addr: "2001:db8::2:3".parse().unwrap(),
        }
    }

    #[test]
    fn test_deconstruct() {
        let m = Message::new_checked(&V4_ACCEPT[..]).unwrap();
        assert_eq!(m.version(), 0);
        assert_eq!(m.msg_type(), MsgType::ACCEPT);
        assert_eq!(m.ip_version(), IpVersion::V4);
        assert_eq!(m.pm_time(), PmTime(8));
        assert_eq!(m.reserved(), 0);
        assert_eq!(m.ap_port(), 5001);
        assert_eq!(m.cp_port(), 40000);
        assert_eq!(m.assoc_handle(), 0x0123_4567_89ab_cdef);
        assert_eq!(m.cp_ip_addr()[..4], [192, 0, 2, 1]);
        assert_eq!(m.cp_ip_addr()[4..], [0; 12]);
        assert_eq!(m.ap_ip_addr()[..4], [198, 51, 100, 7]);

        let m = Message::new_checked(&V6_REQ[..]).unwrap();
        assert_eq!(m.version(), 0);
        assert_eq!(m.msg_type(), MsgType::REQ);
        assert_eq!(m.ip_version(), IpVersion::V6);
        assert_eq!(m.pm_time(), PmTime(0));
        assert_eq!(m.ap_port(), 22);
        assert_eq!(m.cp_port(), 0xfffe);
        assert_eq!(m.assoc_handle(), 0xfedc_ba98_7654_3210);
        assert_eq!(
            Ipv6Addr::from(m.cp_ip_addr()),
            "2001:db8::1".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            Ipv6Addr::from(m.ap_ip_addr()),
            "2001:db8::2:3".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn test_construct() {
        let mut buf = [0xa5u8; 48];
        let mut m = Message::new_unchecked(&mut buf[..]);
        m.set_version(0);
        m.set_msg_type(MsgType::ACCEPT);
        m.set_ip_version(IpVersion::V4);
        m.set_pm_time(PmTime(8));
        m.set_reserved(0);
        m.set_ap_port(5001);
        m.set_cp_port(40000);
        m.set_assoc_handle(0x0123_4567_89ab_cdef);
        let mut cp = [0u8; 16];
        cp[..4].copy_from_slice(&[192, 0, 2, 1]);
        m.set_cp_ip_addr(cp);
        let mut ap = [0u8; 16];
        ap[..4].copy_from_slice(&[198, 51, 100, 7]);
        m.set_ap_ip_addr(ap);
        assert_eq!(buf, V4_ACCEPT);

        let mut buf = [0xffu8; 48];
        let mut m = Message::new_unchecked(&mut buf[..]);
        m.set_version(0);
        m.set_msg_type(MsgType::REQ);
        m.set_ip_version(IpVersion::V6);
        m.set_pm_time(PmTime(0));
        m.set_reserved(0);
        m.set_ap_port(22);
        m.set_cp_port(0xfffe);
        m.set_assoc_handle(0xfedc_ba98_7654_3210);
        m.set_cp_ip_addr("2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        m.set_ap_ip_addr("2001:db8::2:3".parse::<Ipv6Addr>().unwrap().octets());
        assert_eq!(buf, V6_REQ);
    }

    #[test]
    fn test_parse() {
        let m = Message::new_checked(&V4_ACCEPT[..]).unwrap();
        assert_eq!(MessageRepr::parse(&m), Ok(v4_accept_repr()));
        assert_eq!(MessageRepr::parse_bytes(&V6_REQ), Ok(v6_req_repr()));
    }

    #[test]
    fn test_emit() {
        let mut buf = [0x5au8; 48];
        v4_accept_repr().emit(&mut Message::new_unchecked(&mut buf[..]));
        assert_eq!(buf, V4_ACCEPT);
        assert_eq!(v6_req_repr().to_bytes(), V6_REQ);
        assert_eq!(v4_accept_repr().buffer_len(), MESSAGE_LEN);
    }

    #[test]
    fn every_message_type() {
        // First byte for each MT with IPV 4 and IPV 6; all parse and round trip.
        for (mt, b4, b6) in [
            (MsgType::REQ, 0x04u8, 0x06u8),
            (MsgType::ACCEPT, 0x14, 0x16),
            (MsgType::ACK, 0x24, 0x26),
            (MsgType::DENY, 0x34, 0x36),
        ] {
            let mut bytes = V4_ACCEPT;
            bytes[0] = b4;
            if mt != MsgType::ACCEPT {
                bytes[1] = 0;
            }
            let r = MessageRepr::parse_bytes(&bytes).unwrap();
            assert_eq!(r.mtype, mt);
            assert_eq!(r.to_bytes(), bytes, "{mt}");

            let mut bytes = V6_REQ;
            bytes[0] = b6;
            let r = MessageRepr::parse_bytes(&bytes).unwrap();
            assert_eq!(r.mtype, mt);
            assert_eq!(r.ip_version(), IpVersion::V6);
            assert_eq!(r.to_bytes(), bytes, "{mt}");
        }
        assert_eq!(MsgType::REQ.name(), "PMReq");
        assert_eq!(MsgType::ACCEPT.to_string(), "PMAccept");
        assert_eq!(MsgType::ACK.name(), "PMAck");
        assert_eq!(MsgType::DENY.name(), "PMDeny");
        assert_eq!(MsgType(7).name(), "reserved");
    }

    #[test]
    fn truncated() {
        for len in 0..MESSAGE_LEN {
            assert_eq!(
                Message::new_checked(&V4_ACCEPT[..len]),
                Err(Error::Truncated),
                "len {len}"
            );
            assert_eq!(
                MessageRepr::parse_bytes(&V6_REQ[..len]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn too_long() {
        let mut long = V4_ACCEPT.to_vec();
        long.push(0);
        assert_eq!(Message::new_checked(&long[..]), Err(Error::TooLong));
        long.extend_from_slice(&[0; 1000]);
        assert_eq!(MessageRepr::parse_bytes(&long), Err(Error::TooLong));
    }

    #[test]
    fn bad_version() {
        for ver in 1..4u8 {
            let mut b = V4_ACCEPT;
            b[0] |= ver << 6;
            let m = Message::new_checked(&b[..]).unwrap();
            assert_eq!(m.version(), ver);
            assert_eq!(MessageRepr::parse(&m), Err(Error::BadVersion));
        }
    }

    #[test]
    fn reserved_ip_version() {
        for ipv in (0..16u8).filter(|&v| v != 4 && v != 6) {
            let mut b = V6_REQ;
            b[0] = (b[0] & 0xf0) | ipv;
            assert_eq!(
                MessageRepr::parse_bytes(&b),
                Err(Error::ReservedIpVersion),
                "ipv {ipv}"
            );
        }
    }

    #[test]
    fn ignored_on_receive() {
        // Reserved, IPv4 padding, and PmTime outside PMAccept are ignored.
        let mut b = V4_ACCEPT;
        b[2] = 0xff;
        b[3] = 0x01;
        b[20..32].fill(0xee);
        b[36..48].fill(0x11);
        assert_eq!(MessageRepr::parse_bytes(&b), Ok(v4_accept_repr()));
        // ... and emitted as zero.
        assert_eq!(v4_accept_repr().to_bytes(), V4_ACCEPT);

        let mut b = V6_REQ;
        b[1] = 200;
        assert_eq!(MessageRepr::parse_bytes(&b), Ok(v6_req_repr()));
        let mut r = v6_req_repr();
        r.pm_time = PmTime(200);
        assert_eq!(r.to_bytes(), V6_REQ);
    }

    #[test]
    fn mixed_families_emit_as_v6() {
        let mut r = v6_req_repr();
        r.cp_addr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        let b = r.to_bytes();
        assert_eq!(b[0] & 0xf, 6);
        assert_eq!(
            b[16..32],
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]
        );
    }

    #[test]
    fn pm_time_decode() {
        assert_eq!(pm_time::decode(0), Duration::ZERO);
        assert_eq!(pm_time::decode(1), Duration::from_millis(250));
        assert_eq!(pm_time::decode(4), Duration::from_secs(1));
        assert_eq!(pm_time::decode(127), Duration::from_millis(31_750));
        assert_eq!(pm_time::decode(128), Duration::from_secs(128));
        assert_eq!(pm_time::decode(254), Duration::from_secs(254));
        assert_eq!(pm_time::decode(255), Duration::MAX);
        assert_eq!(PmTime::PERMANENT.duration(), pm_time::PERMANENT);
    }

    #[test]
    fn pm_time_encode() {
        let ms = Duration::from_millis;
        assert_eq!(pm_time::encode(Duration::ZERO), 0);
        assert_eq!(pm_time::encode(ms(249)), 0);
        assert_eq!(pm_time::encode(ms(250)), 1);
        assert_eq!(pm_time::encode(ms(499)), 1);
        assert_eq!(pm_time::encode(ms(500)), 2);
        assert_eq!(pm_time::encode(ms(31_750)), 127);
        // The gap between 31.75 s and 128 s rounds down.
        assert_eq!(pm_time::encode(ms(31_999)), 127);
        assert_eq!(pm_time::encode(ms(127_999)), 127);
        assert_eq!(pm_time::encode(ms(128_000)), 128);
        assert_eq!(pm_time::encode(ms(128_999)), 128);
        assert_eq!(pm_time::encode(ms(254_000)), 254);
        assert_eq!(pm_time::encode(ms(255_000)), 254);
        assert_eq!(pm_time::encode(Duration::from_secs(u64::MAX)), 254);
        assert_eq!(pm_time::encode(Duration::MAX), 255);
        assert_eq!(PmTime::from_duration(ms(1000)), PmTime(4));
        // Every code survives decode then encode.
        for c in 0..=255u8 {
            assert_eq!(pm_time::encode(pm_time::decode(c)), c);
        }
    }

    #[test]
    fn error_display() {
        assert_eq!(
            Error::Truncated.to_string(),
            "port mapper message shorter than 48 bytes"
        );
        assert_eq!(IpVersion(9).to_string(), "reserved IPV 9");
    }
}
