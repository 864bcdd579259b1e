//! Logging: structured tracing to stderr, as text or JSON.
//!
//! Text is coloured only when stderr is a terminal (and `NO_COLOR` is not set): in a
//! pod, stderr is a pipe the container runtime stores, and escape codes there reach
//! `kubectl logs` and log collectors as noise. Plain text is also cheaper to write: a
//! request's span fields are formatted as they are recorded, colour codes and all.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::cli::{LogArgs, LogFormat};

pub fn init(args: &LogArgs) -> anyhow::Result<()> {
    let filter = EnvFilter::try_new(&args.log_level)
        .map_err(|e| anyhow::anyhow!("--log-level {:?}: {e}", args.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(std::io::stderr);
    let installed = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}

/// Whether text logs are coloured: on a terminal, unless `NO_COLOR` is set to anything
/// but the empty string (no-color.org).
fn colour(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_coloured_only_on_a_terminal_that_did_not_ask_for_none() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".into())));
        assert!(!colour(true, Some("1".into())));
        assert!(!colour(false, None), "a pipe or a file gets plain text");
    }
}
