//! The bottom layer: the C library's own functions and what the layers
//! above need around them, with no knowledge of sockets the preload
//! manages.
//!
//! * [`real`] — the C library's real functions (`dlsym(RTLD_NEXT)`).
//! * [`errno`] — `errno` kept across the preload's own calls, `fail`.
//! * [`addr`] — `sockaddr` to and from `std`, our own `getsockname` and
//!   `getsockopt`.
//! * [`guard`] — "inside the preload" per thread, the library's own
//!   threads (every signal blocked), the process id.
//! * [`signals`] — signals held back while a blocking call goes to sleep.

pub mod addr;
pub mod errno;
pub mod guard;
pub mod real;
pub mod signals;
