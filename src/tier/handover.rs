//! Handing the state and CA directories to the proxy uid before root is
//! dropped (transparent tier with `--install-redirect`). Root chowns what the
//! operator named, so the walk must not be a way to chown anything else:
//!
//! - a shared directory is refused outright: `/` or a direct child of it
//!   (`/tmp`, `/home`, `/etc`), one that is world-writable or sticky, or one
//!   owned by a user other than root or the proxy uid;
//! - nothing is followed: every directory is opened relative to its parent
//!   with `O_NOFOLLOW | O_DIRECTORY`, every other entry is chowned with
//!   `AT_SYMLINK_NOFOLLOW`, so a name swapped for a link mid-walk is refused
//!   or changes only the link itself;
//! - a regular file with more than one hard link is refused (it could be a
//!   link to a file outside, such as `/etc/shadow`);
//! - the walk is bounded ([`MAX_ENTRIES`]) and stays on one file system.

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use anyhow::{bail, Context, Result};
use rustix::fs::{
    chownat, fchown, fstat, openat, statat, AtFlags, Dir, FileType, Gid, Mode, OFlags, Uid, CWD,
};

/// Entries a hand-over walks before it gives up (a state directory holds a
/// handful of files; a huge tree means the wrong directory was named).
pub const MAX_ENTRIES: usize = 100_000;

const OPEN_DIR: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Chowns `dir` and everything in it to `uid:gid`, refusing a shared
/// directory (see the module docs).
pub fn hand_over(dir: &Path, uid: u32, gid: u32) -> Result<()> {
    let canonical = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    if canonical.parent().is_none_or(|p| p == Path::new("/")) {
        bail!(
            "{} is a system directory, not a state directory. Next: pass a directory of its own, such as /var/lib/veris",
            canonical.display()
        );
    }
    let fd = openat(CWD, dir, OPEN_DIR, Mode::empty()).with_context(|| {
        format!(
            "opening {} (a symbolic link is refused: name the directory itself)",
            dir.display()
        )
    })?;
    let st = fstat(&fd)?;
    let mode = st.st_mode;
    if mode & 0o002 != 0 || mode & 0o1000 != 0 {
        bail!(
            "{} is shared (world-writable or sticky, mode {:o}): other users could plant files in it. Next: pass a directory of its own, such as /var/lib/veris",
            dir.display(),
            mode & 0o7777
        );
    }
    if st.st_uid != 0 && st.st_uid != uid {
        bail!(
            "{} belongs to uid {}, neither root nor the proxy uid {uid}. Next: pass a directory of its own, such as /var/lib/veris",
            dir.display(),
            st.st_uid
        );
    }
    let mut walk = Walk {
        uid: Uid::from_raw(uid),
        gid: Gid::from_raw(gid),
        dev: st.st_dev,
        left: MAX_ENTRIES,
    };
    walk.dir(fd, dir)
}

struct Walk {
    uid: Uid,
    gid: Gid,
    dev: u64,
    left: usize,
}

impl Walk {
    fn dir(&mut self, fd: OwnedFd, path: &Path) -> Result<()> {
        let st = fstat(&fd)?;
        if st.st_dev != self.dev {
            bail!(
                "{} is on another file system; refusing to hand it over",
                path.display()
            );
        }
        fchown(&fd, Some(self.uid), Some(self.gid))
            .with_context(|| format!("chown {}", path.display()))?;
        let mut subdirs = Vec::new();
        for entry in Dir::read_from(&fd)? {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            self.left = self.left.checked_sub(1).with_context(|| {
                format!(
                    "{} holds more than {MAX_ENTRIES} entries: not a state directory",
                    path.display()
                )
            })?;
            let child = path.join(std::ffi::OsStr::from_bytes(name.to_bytes()));
            if entry.file_type() == FileType::Directory {
                subdirs.push((name.to_owned(), child));
                continue;
            }
            let st = statat(&fd, name, AtFlags::SYMLINK_NOFOLLOW)?;
            if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile && st.st_nlink > 1 {
                bail!(
                    "{} has {} hard links; one may point outside the directory. Next: remove the extra link",
                    child.display(),
                    st.st_nlink
                );
            }
            chownat(
                &fd,
                name,
                Some(self.uid),
                Some(self.gid),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .with_context(|| format!("chown {}", child.display()))?;
        }
        for (name, child) in subdirs {
            let sub = openat(&fd, &name, OPEN_DIR, Mode::empty()).with_context(|| {
                format!("opening {} (changed during the walk?)", child.display())
            })?;
            self.dir(sub, &child)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    const PROXY: u32 = 14741;

    /// A directory under /var/tmp that is not a direct child of `/`.
    fn scratch(name: &str) -> std::path::PathBuf {
        let base =
            std::env::temp_dir().join(format!("veris-handover-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("state")).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o755)).unwrap();
        base
    }

    fn root() -> bool {
        if crate::os::prctl::euid() == 0 {
            return true;
        }
        if std::env::var_os("VERIS_REQUIRE_ALL").is_some() {
            panic!("VERIS_REQUIRE_ALL=1 but not root");
        }
        eprintln!("SKIP: chown needs root");
        // One line for `scripts/test`'s summary of skipped tests.
        if let Some(log) = std::env::var_os("VERIS_SKIP_LOG") {
            use std::io::Write as _;
            let test = std::thread::current().name().unwrap_or("?").to_string();
            let line = format!("veris::{test}: chown needs root\n");
            let _ = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(log)
                .and_then(|mut f| f.write_all(line.as_bytes()));
        }
        false
    }

    #[test]
    fn hands_over_the_tree_without_following_links() {
        if !root() {
            return;
        }
        let base = scratch("tree");
        let state = base.join("state");
        std::fs::create_dir_all(state.join("trust/java")).unwrap();
        std::fs::write(state.join("ledger.jsonl"), b"").unwrap();
        std::fs::write(state.join("trust/java/cacerts"), b"").unwrap();
        let outside = base.join("outside");
        std::fs::write(&outside, b"not ours").unwrap();
        std::os::unix::fs::symlink(&outside, state.join("link")).unwrap();
        std::os::unix::fs::symlink(&base, state.join("dirlink")).unwrap();

        hand_over(&state, PROXY, PROXY).unwrap();

        for p in [
            "",
            "ledger.jsonl",
            "trust",
            "trust/java",
            "trust/java/cacerts",
        ] {
            let m = std::fs::symlink_metadata(state.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (PROXY, PROXY), "{p}");
        }
        assert_eq!(
            std::fs::symlink_metadata(state.join("link")).unwrap().uid(),
            PROXY
        );
        assert_eq!(
            std::fs::metadata(&outside).unwrap().uid(),
            0,
            "a link's target is never chowned"
        );
        assert_eq!(
            std::fs::metadata(&base).unwrap().uid(),
            0,
            "a link to a directory is not walked"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn shared_directories_are_refused() {
        if !root() {
            return;
        }
        for system in ["/", "/tmp", "/etc"] {
            let e = hand_over(Path::new(system), PROXY, PROXY)
                .unwrap_err()
                .to_string();
            assert!(e.contains("system directory"), "{system}: {e}");
        }
        let base = scratch("shared");
        let state = base.join("state");
        for (mode, what) in [(0o777, "world-writable"), (0o1755, "sticky")] {
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = hand_over(&state, PROXY, PROXY).unwrap_err().to_string();
            assert!(e.contains("shared"), "{what}: {e}");
        }
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&state, Some(4242), None).unwrap();
        let e = hand_over(&state, PROXY, PROXY).unwrap_err().to_string();
        assert!(e.contains("belongs to uid 4242"), "{e}");
        std::os::unix::fs::chown(&state, Some(0), None).unwrap();

        let link = base.join("link");
        std::os::unix::fs::symlink(&state, &link).unwrap();
        let e = format!("{:#}", hand_over(&link, PROXY, PROXY).unwrap_err());
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(
            std::fs::metadata(&state).unwrap().uid(),
            0,
            "nothing was chowned"
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_hard_link_to_a_file_outside_is_refused() {
        if !root() {
            return;
        }
        let base = scratch("hardlink");
        let state = base.join("state");
        let outside = base.join("shadow");
        std::fs::write(&outside, b"secret").unwrap();
        std::fs::hard_link(&outside, state.join("planted")).unwrap();
        let e = hand_over(&state, PROXY, PROXY).unwrap_err().to_string();
        assert!(e.contains("hard links"), "{e}");
        assert_eq!(std::fs::metadata(&outside).unwrap().uid(), 0);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
