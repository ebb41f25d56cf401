//! The workspace's binaries, for tests that run them as programs.

use std::path::PathBuf;
use std::process::Command;

/// The target directory and profile directory this test binary was built
/// in (`target/debug/deps/foo-123` → `target`, `debug`).
fn target_dirs() -> (PathBuf, PathBuf) {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable in target/<profile>/deps")
        .to_path_buf();
    let target = profile_dir
        .parent()
        .expect("target directory")
        .to_path_buf();
    (target, profile_dir)
}

/// Path to binary `bin` of workspace package `package`, built (or brought
/// up to date) with the profile of the running test, in the same target
/// directory.
///
/// # Panics
///
/// When the build fails.
pub fn cargo_bin(package: &str, bin: &str) -> PathBuf {
    let (target, profile_dir) = target_dirs();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", package, "--bin", bin])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build");
    assert!(
        status.success(),
        "cargo build -p {package} --bin {bin} failed"
    );
    profile_dir.join(bin)
}
