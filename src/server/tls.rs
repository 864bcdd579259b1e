//! rustls serving with certificate hot-reload.
