//! veris-proxy moves bytes and decides routes.
#![forbid(unsafe_code)]
