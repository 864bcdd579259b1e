//! TLS material: a CA and a serving certificate (rcgen).
