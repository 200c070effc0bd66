//! A test's scratch folder, and the `kiln` binary run as a user would run it offline.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh empty directory under the system temp dir, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "kiln-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// `kiln ARGS` with its models in `models`, no proxy and no backtraces, for the caller to add
/// its own environment to.
pub fn kiln_command(args: &[&str], models: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln"));
    cmd.args(args)
        .env("KILN_MODELS", models)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    for v in ["http_proxy", "https_proxy", "all_proxy"] {
        cmd.env_remove(v).env_remove(v.to_ascii_uppercase());
    }
    cmd
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The names in `dir`, sorted (none where it does not exist).
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Install Debian `packages` with apt-get, for a test whose tools are `missing` (the sentence
/// saying what to install); fails with that sentence where it is not root with apt-get, or
/// where apt-get fails.
pub fn apt_install(packages: &[&str], missing: &str) {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    let apt_get = Command::new("apt-get").arg("--version").output().is_ok();
    assert!(
        root && apt_get,
        "{missing} (not root with apt-get, so the test cannot)"
    );
    let apt = |args: &[&str]| {
        let ok = Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "{missing} (apt-get {} failed)", args.join(" "));
    };
    apt(&["update"]);
    let mut install = vec!["install", "-y"];
    install.extend_from_slice(packages);
    apt(&install);
}

/// The Vulkan device, after installing Mesa's lavapipe where there is none and that is
/// possible (root with apt-get); fails saying what to install where it is not.
pub fn vulkan_device() {
    use kiln::backend::vulkan;
    if let Err(first) = vulkan::open() {
        let missing = format!(
            "{first}: the Vulkan tests need a Vulkan driver: install Debian's \
             mesa-vulkan-drivers and libvulkan1 (apt-get install mesa-vulkan-drivers libvulkan1)"
        );
        apt_install(&["mesa-vulkan-drivers", "libvulkan1"], &missing);
        vulkan::open().unwrap_or_else(|e| panic!("{missing} (installed, but: {e})"));
    }
}
