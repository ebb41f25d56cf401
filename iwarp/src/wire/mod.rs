//! Wire formats of the iWARP stack.
//!
//! Every format has a checked view (`Packet`/`Frame` over `T: AsRef<[u8]>`,
//! validated once by `new_checked`, so no accessor can panic) and a plain
//! `Repr` struct with `parse`, `emit` and `buffer_len`. Decode errors are
//! cheap enums that convert with `From` into the Terminate triple of
//! [`terminate::TermCode`].

pub mod crc;
pub mod ddp;
pub mod fpdu;
pub mod mpa;
pub mod rdmap;
pub mod term_code;
pub mod terminate;
