//! The CA bundles runtimes and SDKs ship with them, found before an isolated
//! run starts so that its init step puts the veris bundle over each one.
//!
//! Clients such as the stripe Python SDK (`stripe/data/ca-certificates.crt`),
//! certifi (`certifi/cacert.pem`, pip's vendored copy too), botocore,
//! httplib2, grpc (`grpc/_cython/_credentials/roots.pem`) and Java (its
//! JDK's `lib/security/cacerts`) read roots of their own, not the system
//! store, and no one variable reaches all of them. The scan looks where the
//! command's interpreters look, without starting them: each `python3` and
//! `python` on the command's PATH (through symlinks, a venv's prefix, a
//! pyenv shim's versions) gives site-packages and dist-packages dirs, the
//! user's under HOME too, walked a few levels for bundle file names
//! ([`NAMES`]); each `java` on PATH, and `JAVA_HOME`, gives its JDK's
//! `cacerts`, covered with veris's Java truststore. A bundle installed
//! while the command runs (a `pip install` inside it) is not covered.
//!
//! The walk's result is cached under the state dir, keyed by the dirs and
//! their mtimes. The cache is a hint the workload can write, so every file
//! it names is checked as a freshly walked one is ([`pem_bundle`]): at a
//! bundle name no deeper than the walk goes, in one of the dirs found this
//! time, no symlink on the way, a regular file owned by root or by that
//! dir's owner, starting like a PEM bundle. A forged entry can therefore
//! name only a file the walk itself could have found; what it can do is
//! leave one out, and that client's refusal of the veris CA is then
//! recorded as a trust failure. The init step covers a file only when the
//! path still leads to the very file checked here (device and inode).

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// File names of CA bundles shipped in Python packages.
pub const NAMES: &[&str] = &[
    "cacert.pem",
    "cacerts.pem",
    "cacerts.txt",
    "ca-certificates.crt",
    "ca-bundle.crt",
    "ca-bundle.pem",
    "roots.pem",
];

/// Dirs whose subdirs are walked one level deeper (vendored packages:
/// `pip/_vendor/certifi/cacert.pem`; grpc's `_cython/_credentials`).
const DEEPER: &[&str] = &[
    "_vendor",
    "vendor",
    "_vendored",
    "vendored",
    "third_party",
    "_cython",
];

/// At most this many dirs are read per scan (a bound, not a budget any
/// real site-packages reaches).
const MAX_DIRS: usize = 50_000;

/// How much of a file is read to see that it holds PEM certificates.
const PEM_PEEK: u64 = 16 * 1024;

/// The cache file under the state dir, and its size bound.
pub const CACHE_FILE: &str = "cache/bundles.json";
const CACHE_CAP: u64 = 1 << 20;

/// What a bundle file holds, and so which veris file goes over it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// PEM certificates: covered with the bundle (system roots + veris CA).
    Pem,
    /// A Java keystore (JKS or PKCS#12): covered with the truststore.
    Keystore,
}

/// One file to cover, as the scan checked it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bundle {
    pub path: PathBuf,
    pub format: Format,
    /// Device and inode of the checked file: the init step covers this
    /// file only, whatever the path leads to by then.
    pub dev: u64,
    pub ino: u64,
}

/// The command's environment as far as the scan reads it.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub path: Option<OsString>,
    pub home: Option<PathBuf>,
    pub java_home: Option<OsString>,
}

impl Env {
    /// This process's (the command inherits it).
    pub fn from_env() -> Env {
        Env {
            path: std::env::var_os("PATH"),
            home: std::env::var_os("HOME").map(PathBuf::from),
            java_home: std::env::var_os("JAVA_HOME"),
        }
    }

    fn path_dirs(&self) -> Vec<PathBuf> {
        self.path
            .as_deref()
            .map(|p| std::env::split_paths(p).collect())
            .unwrap_or_default()
    }
}

/// The bundle files the command's Python and Java would read, checked;
/// `cache` (a file under the state dir) saves the walk when the
/// site-packages dirs have not changed since it was written.
pub fn scan(env: &Env, cache: Option<&Path>) -> Vec<Bundle> {
    let sites = site_dirs(env);
    let key = cache_key(&sites);
    let cached = cache.and_then(|c| read_cache(c, &key));
    let candidates = match cached {
        Some(files) => files,
        None => {
            let mut found = Vec::new();
            let mut budget = MAX_DIRS;
            for (site, _) in &sites {
                walk(site, 0, &mut budget, &mut found);
            }
            if let Some(c) = cache {
                write_cache(c, &key, &found);
            }
            found
        }
    };
    let mut out: Vec<Bundle> = candidates
        .iter()
        .filter_map(|p| pem_bundle(&sites, p))
        .collect();
    for cacerts in jdk_cacerts(env) {
        if let Some(b) = keystore(&cacerts) {
            out.push(b);
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|b| seen.insert((b.dev, b.ino)));
    out
}

/// The prefixes of every `python3` and `python` on PATH: the PATH entry's
/// own (a venv), the resolved interpreter's, and a pyenv-style shim dir's
/// installed versions (`<root>/shims` → `<root>/versions/*`).
fn python_prefixes(env: &Env) -> Vec<PathBuf> {
    let mut prefixes = Vec::new();
    for dir in env.path_dirs() {
        for name in ["python3", "python"] {
            let exe = dir.join(name);
            if !std::fs::metadata(&exe).is_ok_and(|m| m.is_file()) {
                continue;
            }
            prefixes.extend(dir.parent().map(Path::to_path_buf));
            if let Ok(real) = std::fs::canonicalize(&exe) {
                prefixes.extend(real.parent().and_then(Path::parent).map(Path::to_path_buf));
            }
            if dir.file_name() == Some(OsStr::new("shims")) {
                if let Some(Ok(versions)) =
                    dir.parent().map(|r| std::fs::read_dir(r.join("versions")))
                {
                    prefixes.extend(versions.flatten().map(|e| e.path()));
                }
            }
        }
    }
    prefixes
}

/// Existing site-packages and dist-packages dirs, canonical, each with its
/// owner's uid.
fn site_dirs(env: &Env) -> Vec<(PathBuf, u32)> {
    let mut libs: Vec<PathBuf> = Vec::new();
    for prefix in python_prefixes(env) {
        for lib in ["lib", "lib64", "local/lib"] {
            libs.push(prefix.join(lib));
        }
    }
    libs.extend(env.home.as_ref().map(|h| h.join(".local/lib")));
    let mut out: Vec<(PathBuf, u32)> = Vec::new();
    let mut seen_libs = std::collections::HashSet::new();
    for lib in libs {
        let Ok(lib) = std::fs::canonicalize(&lib) else {
            continue;
        };
        if !seen_libs.insert(lib.clone()) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_name().as_encoded_bytes().starts_with(b"python") {
                continue;
            }
            for sub in ["site-packages", "dist-packages"] {
                let Ok(dir) = std::fs::canonicalize(entry.path().join(sub)) else {
                    continue;
                };
                let Ok(meta) = std::fs::metadata(&dir) else {
                    continue;
                };
                if meta.is_dir() && !out.iter().any(|(d, _)| d == &dir) {
                    out.push((dir, meta.uid()));
                }
            }
        }
    }
    out
}

/// Collects files named like a bundle under `dir` (`depth` levels below a
/// site dir): packages and their subdirs, one level more under [`DEEPER`].
/// Symlinks are neither followed nor collected.
fn walk(dir: &Path, depth: usize, budget: &mut usize, found: &mut Vec<PathBuf>) {
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let deeper = dir
        .file_name()
        .and_then(OsStr::to_str)
        .is_some_and(|n| DEEPER.contains(&n));
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if kind.is_file() && depth >= 1 && NAMES.contains(&name) {
            found.push(entry.path());
        } else if kind.is_dir()
            && (depth < 2 || (depth == 2 && deeper))
            && !name.starts_with('.')
            && name != "__pycache__"
            && !name.ends_with(".dist-info")
            && !name.ends_with(".egg-info")
        {
            walk(&entry.path(), depth + 1, budget, found);
        }
    }
}

/// `path` when it is a bundle the walk could have found: under one of
/// `sites` at a bundle name no deeper than the walk goes, with no symlink
/// on the way, a regular file owned by root or the site dir's owner,
/// holding PEM certificates.
fn pem_bundle(sites: &[(PathBuf, u32)], path: &Path) -> Option<Bundle> {
    let (site, owner) = sites.iter().find(|(s, _)| path.starts_with(s))?;
    let rel: Vec<&str> = path
        .strip_prefix(site)
        .ok()?
        .components()
        .map(|c| match c {
            Component::Normal(n) => n.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let shape = match rel.len() {
        2 | 3 => true,
        4 => DEEPER.contains(&rel[1]),
        _ => false,
    };
    if !shape || !NAMES.contains(rel.last()?) || rel.iter().any(|c| c.starts_with('.')) {
        return None;
    }
    if std::fs::canonicalize(path).ok()? != path {
        return None;
    }
    let (meta, head) = open_checked(path)?;
    if meta.uid() != 0 && meta.uid() != *owner {
        return None;
    }
    let mut head = head;
    use std::io::Read;
    let mut buf = Vec::new();
    head.by_ref().take(PEM_PEEK).read_to_end(&mut buf).ok()?;
    let marker = b"-----BEGIN CERTIFICATE-----";
    if !buf.windows(marker.len()).any(|w| w == marker) {
        return None;
    }
    Some(Bundle {
        path: path.to_path_buf(),
        format: Format::Pem,
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// Opens `path` without following a final symlink or blocking, as a
/// regular file; its metadata and the open file.
fn open_checked(path: &Path) -> Option<(std::fs::Metadata, std::fs::File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    meta.is_file().then_some((meta, file))
}

/// The `cacerts` of each JDK whose `java` is on PATH, and of `JAVA_HOME`.
fn jdk_cacerts(env: &Env) -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = env
        .path_dirs()
        .iter()
        .map(|d| d.join("java"))
        .filter(|j| std::fs::metadata(j).is_ok_and(|m| m.is_file()))
        .filter_map(|j| std::fs::canonicalize(j).ok())
        .filter_map(|j| j.parent().and_then(Path::parent).map(Path::to_path_buf))
        .collect();
    homes.extend(env.java_home.as_ref().map(PathBuf::from));
    homes
        .iter()
        .flat_map(|h| ["lib/security/cacerts", "jre/lib/security/cacerts"].map(|f| h.join(f)))
        .filter_map(|f| std::fs::canonicalize(f).ok())
        .collect()
}

/// `path` when it is a Java keystore named `cacerts` (JKS magic, or the
/// DER sequence PKCS#12 starts with), owned by root or its dir's owner.
fn keystore(path: &Path) -> Option<Bundle> {
    if path.file_name() != Some(OsStr::new("cacerts")) {
        return None;
    }
    let dir_owner = std::fs::metadata(path.parent()?).ok()?.uid();
    let (meta, mut file) = open_checked(path)?;
    if meta.uid() != 0 && meta.uid() != dir_owner {
        return None;
    }
    use std::io::Read;
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).ok()?;
    if magic != [0xfe, 0xed, 0xfe, 0xed] && magic[0] != 0x30 {
        return None;
    }
    Some(Bundle {
        path: path.to_path_buf(),
        format: Format::Keystore,
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// The cache's content: the key it was written for and what the walk found.
#[derive(Serialize, Deserialize)]
struct Cache {
    key: Vec<(PathBuf, i64, i64)>,
    files: Vec<PathBuf>,
}

/// Each site dir and its mtime: a package installed or removed changes it.
fn cache_key(sites: &[(PathBuf, u32)]) -> Vec<(PathBuf, i64, i64)> {
    sites
        .iter()
        .map(|(d, _)| {
            let m = std::fs::metadata(d).ok();
            (
                d.clone(),
                m.as_ref().map_or(0, |m| m.mtime()),
                m.as_ref().map_or(0, |m| m.mtime_nsec()),
            )
        })
        .collect()
}

fn read_cache(path: &Path, key: &[(PathBuf, i64, i64)]) -> Option<Vec<PathBuf>> {
    let text = crate::util::read_bounded(path, CACHE_CAP, false).ok()?;
    let cache: Cache = serde_json::from_str(&text).ok()?;
    (cache.key == key).then_some(cache.files)
}

fn write_cache(path: &Path, key: &[(PathBuf, i64, i64)], files: &[PathBuf]) {
    let cache = Cache {
        key: key.to_vec(),
        files: files.to_vec(),
    };
    let written = serde_json::to_vec(&cache)
        .map_err(std::io::Error::other)
        .and_then(|bytes| {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            veris_ca::fsutil::write_file(path, &bytes, 0o644)
        });
    if let Err(e) = written {
        tracing::debug!(error = %e, "cannot cache the bundle scan");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "# a comment\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn tree() -> (PathBuf, Env) {
        let root = std::env::temp_dir().join(format!(
            "veris-bundles-{}-{}",
            std::process::id(),
            crate::util::random_hex(4).unwrap()
        ));
        let site = root.join("venv/lib/python3.11/site-packages");
        for (rel, body) in [
            ("certifi/cacert.pem", PEM),
            ("stripe/data/ca-certificates.crt", PEM),
            ("pip/_vendor/certifi/cacert.pem", PEM),
            ("grpc/_cython/_credentials/roots.pem", PEM),
            // Too deep outside a vendored dir, and not PEM.
            ("pkg/a/b/cacert.pem", PEM),
            ("notpem/cacert.pem", "hello"),
        ] {
            let p = site.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, body).unwrap();
        }
        std::fs::create_dir_all(root.join("venv/bin")).unwrap();
        std::fs::write(root.join("venv/bin/python3"), "").unwrap();
        let env = Env {
            path: Some(root.join("venv/bin").into()),
            home: None,
            java_home: None,
        };
        (root, env)
    }

    fn names(found: &[Bundle], root: &Path) -> Vec<String> {
        let site = std::fs::canonicalize(root.join("venv/lib/python3.11/site-packages")).unwrap();
        let mut v: Vec<String> = found
            .iter()
            .map(|b| b.path.strip_prefix(&site).unwrap().display().to_string())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn the_walk_finds_the_bundles_packages_ship() {
        let (root, env) = tree();
        let cache = root.join("state").join(CACHE_FILE);
        let want = [
            "certifi/cacert.pem",
            "grpc/_cython/_credentials/roots.pem",
            "pip/_vendor/certifi/cacert.pem",
            "stripe/data/ca-certificates.crt",
        ];
        assert_eq!(names(&scan(&env, Some(&cache)), &root), want);
        // The second scan reads the cache, and finds the same.
        assert!(cache.is_file());
        assert_eq!(names(&scan(&env, Some(&cache)), &root), want);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_forged_cache_names_only_what_the_walk_could_find() {
        let (root, env) = tree();
        let cache = root.join("state").join(CACHE_FILE);
        scan(&env, Some(&cache));
        let site = std::fs::canonicalize(root.join("venv/lib/python3.11/site-packages")).unwrap();
        // A symlink named like a bundle, leading to a file elsewhere.
        let target = root.join("elsewhere.pem");
        std::fs::write(&target, PEM).unwrap();
        std::os::unix::fs::symlink(&target, site.join("certifi/cacerts.pem")).unwrap();
        let mut cache_json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
        cache_json["files"] = serde_json::json!([
            "/etc/passwd",
            target,
            site.join("certifi/cacerts.pem"),
            site.join("certifi/../certifi/cacert.pem"),
            site.join("pkg/a/b/cacert.pem"),
            site.join("notpem/cacert.pem"),
            site.join("stripe/data/ca-certificates.crt"),
        ]);
        std::fs::write(&cache, cache_json.to_string()).unwrap();
        assert_eq!(
            names(&scan(&env, Some(&cache)), &root),
            ["stripe/data/ca-certificates.crt"]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_keystore_must_look_like_one() {
        let dir =
            std::env::temp_dir().join(format!("veris-ks-{}", crate::util::random_hex(4).unwrap()));
        std::fs::create_dir_all(&dir).unwrap();
        let jks = dir.join("cacerts");
        std::fs::write(&jks, [0xfe, 0xed, 0xfe, 0xed, 0, 0, 0, 2]).unwrap();
        assert_eq!(keystore(&jks).unwrap().format, Format::Keystore);
        std::fs::write(&jks, PEM).unwrap();
        assert!(keystore(&jks).is_none());
        let other = dir.join("blocked.certs");
        std::fs::write(&other, [0xfe, 0xed, 0xfe, 0xed]).unwrap();
        assert!(keystore(&other).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
