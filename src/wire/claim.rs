//! A ResourceClaim as a webhook review carries it (`request.object`), decoded into the
//! parts gpu-admission reads (`crate::dra::ResourceClaim`, whose lists are bounded)
//! after the value budget every body part has.

use crate::dra::ResourceClaim;

use super::{DecodeError, MAX_POD_VALUES, check_budget, decode_raw};

/// Decode the claim in `raw` (its JSON text); `what` names the part in errors.
pub(crate) fn decode(what: &str, raw: &str) -> Result<ResourceClaim, DecodeError> {
    check_budget(what, raw.as_bytes(), MAX_POD_VALUES)?;
    decode_raw(what, raw)
}
