//! The OS glue, one module per kind of syscall: processes and signals
//! (`procs`), per-process flags and identity (`prctl`), namespaces and
//! mounts (`ns`), what a child inherits (`fd`), uid switching (`uid`),
//! Landlock (`landlock`), the system tools veris runs (`tool`) and
//! systemd's readiness messages (`notify`).

pub mod fd;
pub mod landlock;
pub mod notify;
pub mod ns;
pub mod prctl;
pub mod procs;
pub mod tool;
pub mod uid;
