//! Finding the system tools veris runs (`nft`, `ip`) on fixed paths first.

/// Where a system tool the isolated and transparent tiers run (`nft`,
/// `ip`) lives: the first executable on `PATH`, else in the sbin dirs
/// distributions put them in, which a normal user's `PATH` lacks (Debian's
/// `nft` is `/usr/sbin/nft`): `VERIS_SBIN_DIRS` (a `PATH`-style list; empty
/// for none), by default `/usr/local/sbin:/usr/sbin:/sbin`. `None` when
/// there is none.
pub fn find_tool(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let sbin = std::env::var_os("VERIS_SBIN_DIRS")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/sbin:/sbin".into());
    std::env::split_paths(&path)
        .chain(std::env::split_paths(&sbin).filter(|d| !d.as_os_str().is_empty()))
        .map(|dir| dir.join(program))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// [`find_tool`], or the bare name (so the error names what is missing).
pub fn tool(program: &str) -> std::path::PathBuf {
    find_tool(program).unwrap_or_else(|| program.into())
}
