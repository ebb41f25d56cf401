//! `sdp-decode FILE`: prints the MPA frames, RDMAP messages and SDP messages
//! (BSDH and extended headers) of every SDP connection in a pcap or pcapng
//! capture, one line each.
//!
//! Capture loopback traffic with, for example,
//! `tcpdump -i lo -w trace.pcap 'tcp port 5201'`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path] = args.as_slice() else {
        eprintln!("usage: sdp-decode CAPTURE-FILE");
        return ExitCode::from(2);
    };
    let file = match std::fs::read(path) {
        Ok(file) => file,
        Err(e) => {
            eprintln!("sdp-decode: {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match sdp_tools::decode::decode(&file) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sdp-decode: {path}: {e}");
            ExitCode::FAILURE
        }
    }
}
