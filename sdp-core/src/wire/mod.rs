//! SDP message formats (draft-pinkerton-iwarp-sdp-01 §6).
