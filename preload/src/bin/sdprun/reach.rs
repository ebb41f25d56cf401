//! Programs the preload library cannot reach, told apart before `exec`.
//!
//! `LD_PRELOAD` works through the dynamic loader and the C library, so a
//! program's connections stay TCP, whatever the rules say, when:
//!
//! * it is statically linked: no loader runs (no `PT_INTERP` header);
//! * it runs in secure-execution mode: setuid or setgid to someone else,
//!   or file capabilities, and the loader then ignores a preload given
//!   with a path (ld.so(8), `AT_SECURE`);
//! * it makes its socket calls itself instead of through the C library:
//!   Go programs (a `.go.buildinfo` or `.note.go.buildid` section), even
//!   when linked with the C library for other reasons.
//!
//! A script is judged by its interpreter (`#!`), one level deep.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why the library cannot reach a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    Static,
    SecureExecution(&'static str),
    OwnSocketCalls(&'static str),
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unreachable::Static => write!(f, "it is statically linked (no dynamic loader runs)"),
            Unreachable::SecureExecution(why) => {
                write!(f, "it is {why}, so the loader ignores LD_PRELOAD")
            }
            Unreachable::OwnSocketCalls(what) => {
                write!(
                    f,
                    "it is {what}, which makes its socket calls without the C library"
                )
            }
        }
    }
}

/// The file `program` names: itself if it has a `/`, else the first match
/// in `PATH` (as `execvp` looks it up).
pub fn resolve(program: &Path, path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if program.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Some(program.to_path_buf());
    }
    std::env::split_paths(path_var?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Why the preload cannot reach the program in `file`, if it cannot;
/// `None` when it can or when the file cannot be read (exec will say).
pub fn check(file: &Path) -> Option<Unreachable> {
    check_depth(file, 0)
}

fn check_depth(file: &Path, depth: u32) -> Option<Unreachable> {
    let meta = std::fs::metadata(file).ok()?;
    if let Some(why) = secure_execution(file, &meta) {
        return Some(Unreachable::SecureExecution(why));
    }
    let mut f = File::open(file).ok()?;
    let mut head = [0u8; 256];
    let n = read_up_to(&mut f, &mut head)?;
    let head = &head[..n];
    if let Some(line) = head.strip_prefix(b"#!") {
        if depth > 0 {
            return None;
        }
        let line = line.split(|&b| b == b'\n').next()?;
        let interp = line
            .split(|b| b.is_ascii_whitespace())
            .find(|w| !w.is_empty())?;
        let interp = Path::new(std::str::from_utf8(interp).ok()?);
        return check_depth(interp, depth + 1);
    }
    let elf = Elf::parse(&mut f, head)?;
    if elf.go {
        return Some(Unreachable::OwnSocketCalls("a Go program"));
    }
    if !elf.interp {
        return Some(Unreachable::Static);
    }
    None
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> Option<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(_) => return None,
        }
    }
    Some(n)
}

/// The loader's secure-execution mode for this process running `file`.
fn secure_execution(file: &Path, meta: &std::fs::Metadata) -> Option<&'static str> {
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let mode = meta.mode();
    if mode & libc::S_ISUID != 0 && meta.uid() != uid {
        return Some("setuid to another user");
    }
    if mode & libc::S_ISGID != 0 && meta.gid() != gid {
        return Some("setgid to another group");
    }
    let name = c"security.capability";
    let path = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: NUL-terminated strings and no buffer (size 0 asks the size).
    let size = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    (size > 0).then_some("given file capabilities")
}

/// What matters of an ELF file here.
struct Elf {
    /// A `PT_INTERP` program header: the dynamic loader runs.
    interp: bool,
    /// A Go toolchain section.
    go: bool,
}

const PT_INTERP: u32 = 3;

impl Elf {
    /// Reads the program headers and the section names of a 64- or 32-bit
    /// little-endian ELF file; `None` if it is not one or is cut short.
    fn parse(f: &mut File, head: &[u8]) -> Option<Elf> {
        if head.len() < 52 || &head[..4] != b"\x7fELF" || head[5] != 1 {
            return None;
        }
        let wide = match head[4] {
            1 => false,
            2 => true,
            _ => return None,
        };
        let u16_at = |o: usize| Some(u16::from_le_bytes(head.get(o..o + 2)?.try_into().ok()?));
        let word = |b: &[u8], o: usize| -> Option<u64> {
            if wide {
                Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
            } else {
                Some(u64::from(u32::from_le_bytes(
                    b.get(o..o + 4)?.try_into().ok()?,
                )))
            }
        };
        let u32_at =
            |b: &[u8], o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let (phoff, shoff) = if wide {
            (word(head, 0x20)?, word(head, 0x28)?)
        } else {
            (word(head, 0x1c)?, word(head, 0x20)?)
        };
        let (phentsize, phnum, shentsize, shnum, shstrndx) = if wide {
            (
                u16_at(0x36)?,
                u16_at(0x38)?,
                u16_at(0x3a)?,
                u16_at(0x3c)?,
                u16_at(0x3e)?,
            )
        } else {
            (
                u16_at(0x2a)?,
                u16_at(0x2c)?,
                u16_at(0x2e)?,
                u16_at(0x30)?,
                u16_at(0x32)?,
            )
        };
        let phdrs = read_at(f, phoff, usize::from(phentsize) * usize::from(phnum))?;
        let interp = phdrs
            .chunks(usize::from(phentsize).max(1))
            .any(|ph| u32_at(ph, 0) == Some(PT_INTERP));
        let shdrs = read_at(f, shoff, usize::from(shentsize) * usize::from(shnum))?;
        let sh = |i: usize| shdrs.get(i * usize::from(shentsize)..(i + 1) * usize::from(shentsize));
        let (off_at, size_at) = if wide { (0x18, 0x20) } else { (0x10, 0x14) };
        let go = match sh(usize::from(shstrndx)) {
            Some(strtab) => {
                let names = read_at(f, word(strtab, off_at)?, word(strtab, size_at)? as usize)?;
                (0..usize::from(shnum)).filter_map(sh).any(|s| {
                    let at = u32_at(s, 0).unwrap_or(u32::MAX) as usize;
                    let name = names.get(at..).unwrap_or(&[]);
                    let name = name.split(|&b| b == 0).next().unwrap_or(&[]);
                    name == b".go.buildinfo" || name == b".note.go.buildid"
                })
            }
            None => false,
        };
        Some(Elf { interp, go })
    }
}

/// `len` bytes at `offset` (at most 16 MiB: headers and a name table).
fn read_at(f: &mut File, offset: u64, len: usize) -> Option<Vec<u8>> {
    if len > 16 << 20 {
        return None;
    }
    f.seek(SeekFrom::Start(offset)).ok()?;
    let mut buf = vec![0; len];
    f.read_exact(&mut buf).ok()?;
    Some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_program_is_reached() {
        let sh = resolve(Path::new("sh"), std::env::var_os("PATH").as_deref()).unwrap();
        assert_eq!(check(&sh), None);
    }

    #[test]
    fn this_test_binary_is_dynamic_and_not_go() {
        let me = std::env::current_exe().unwrap();
        assert_eq!(check(&me), None);
    }

    #[test]
    fn not_an_elf_file_is_left_to_exec() {
        let dir = std::env::temp_dir().join(format!("sdprun-reach-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk");
        std::fs::write(&junk, b"\x7fELF\x02\x01 cut short").unwrap();
        assert_eq!(check(&junk), None);
        let script = dir.join("script");
        std::fs::write(&script, b"#!/bin/sh\necho hi\n").unwrap();
        assert_eq!(check(&script), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
