//! The OS glue: raw syscalls (`sys`: signals, namespaces, mounts, prctl,
//! capabilities, file limits, descendants) and Landlock (`landlock`).

pub mod landlock;
pub mod sys;
