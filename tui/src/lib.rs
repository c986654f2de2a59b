//! veris-tui renders the live view of twin traffic.
#![forbid(unsafe_code)]
