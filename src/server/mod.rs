//! HTTP serving: the TLS port, the plain extender port and the admin port.

pub mod tls;
