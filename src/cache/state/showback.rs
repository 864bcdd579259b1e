//! GPU-seconds per namespace and model: what bound pods were allocated, over time, for
//! chargeback (`gpu_admission_gpu_seconds_total`; docs/quota.md, "Showback").
//!
//! Each (namespace, model) keeps a meter: the GPUs its bound pods hold now (shares and
//! MIG slices as fractions, as `quota::charge_on` prices them) and the GPU-time
//! accumulated up to the meter's last change. A pod's change moves only its own
//! meters, and a read adds the time since: exact, whatever the number of pods.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::placement::quantity::Milli;

/// One (namespace, model)'s GPUs now, and its GPU-time up to `since`.
#[derive(Debug)]
struct Meter {
    /// Thousandths of a GPU held by bound pods now.
    milli: u128,
    /// Milli-GPU × nanoseconds accumulated before `since`.
    accumulated: u128,
    since: Instant,
}

impl Meter {
    fn new(now: Instant) -> Self {
        Meter {
            milli: 0,
            accumulated: 0,
            since: now,
        }
    }

    /// The GPU-time up to `now`, in milli-GPU × nanoseconds.
    fn at(&self, now: Instant) -> u128 {
        let elapsed = now.saturating_duration_since(self.since).as_nanos();
        self.accumulated + self.milli * elapsed
    }

    /// Bring the accumulated time to `now`, then hold `milli` from there on.
    fn set(&mut self, milli: u128, now: Instant) {
        self.accumulated = self.at(now);
        self.since = now.max(self.since);
        self.milli = milli;
    }
}

/// The meters, by namespace, then model. A meter stays when its last pod leaves: its
/// GPU-seconds are a counter and never go back. What each pod holds is kept by the
/// tally beside its charge (`usage.rs`), which moves the meters as it changes.
#[derive(Debug, Default)]
pub(super) struct Showback {
    meters: BTreeMap<Box<str>, BTreeMap<Box<str>, Meter>>,
}

impl Showback {
    /// A bound pod of `namespace` starts (`add`) or stops holding `charge` at `now`.
    /// Only model keys count: a MIG profile's key (`model/profile`) counts slices,
    /// which its model's key already holds as fractions.
    pub(super) fn moved<'a>(
        &mut self,
        namespace: &str,
        charge: impl IntoIterator<Item = (&'a str, Milli)>,
        add: bool,
        now: Instant,
    ) {
        for (model, amount) in charge {
            if model.contains('/') || amount.0 == 0 {
                continue;
            }
            // Looked up by reference: a key is allocated once, when its meter is made.
            if !self
                .meters
                .get(namespace)
                .is_some_and(|m| m.contains_key(model))
            {
                let models = self.meters.entry(namespace.into()).or_default();
                models.insert(model.into(), Meter::new(now));
            }
            let Some(meter) = self
                .meters
                .get_mut(namespace)
                .and_then(|m| m.get_mut(model))
            else {
                continue;
            };
            let milli = match add {
                true => meter.milli + u128::from(amount.0),
                false => meter.milli.saturating_sub(u128::from(amount.0)),
            };
            meter.set(milli, now);
        }
    }

    /// The thousandths of a GPU each model's bound pods in `namespace` hold now.
    #[cfg(test)]
    pub(super) fn held(&self, namespace: &str) -> BTreeMap<String, u128> {
        let meters = self.meters.get(namespace).into_iter().flatten();
        let held = meters.filter(|(_, m)| m.milli > 0);
        held.map(|(model, m)| (model.to_string(), m.milli))
            .collect()
    }

    /// GPU-seconds per (namespace, model) up to `now`.
    pub(super) fn gpu_seconds(&self, now: Instant) -> impl Iterator<Item = (&str, &str, f64)> {
        let meters = self.meters.iter();
        let meters =
            meters.flat_map(|(namespace, models)| models.iter().map(move |m| (namespace, m)));
        meters.map(move |(namespace, (model, meter))| {
            // milli-GPU × ns → GPU × s.
            let seconds = meter.at(now) as f64 / 1e12;
            (&**namespace, &**model, seconds)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Duration;

    fn seconds(showback: &Showback, now: Instant) -> Vec<(String, String, f64)> {
        showback
            .gpu_seconds(now)
            .map(|(n, m, s)| (n.to_string(), m.to_string(), (s * 1000.0).round() / 1000.0))
            .collect()
    }

    #[test]
    fn gpu_seconds_are_gpus_held_times_the_time_held() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut showback = Showback::default();
        // a holds 2 T4s from 0 s to 10 s; b half a T4 from 4 s to 20 s.
        showback.moved("team", [("T4", Milli(2000))], true, at(0));
        showback.moved("team", [("T4", Milli(500))], true, at(4));
        showback.moved("team", [("T4", Milli(2000))], false, at(10));
        let expected = 2.0 * 10.0 + 0.5 * 16.0;
        assert_eq!(
            seconds(&showback, at(20)),
            [("team".into(), "T4".into(), expected)]
        );
        // Nothing held: the counter stands still, and stays.
        showback.moved("team", [("T4", Milli(500))], false, at(20));
        assert_eq!(
            seconds(&showback, at(100)),
            [("team".into(), "T4".into(), 28.0)]
        );
    }

    #[test]
    fn a_slice_counts_as_its_fraction_and_its_profile_key_not_at_all() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut showback = Showback::default();
        // A 1g.5gb slice of an A100: a seventh of a GPU, plus one on its profile key.
        let slice = [("A100", Milli(142)), ("A100/1g.5gb", Milli(1000))];
        showback.moved("team", slice, true, at(0));
        showback.moved("other", [("T4", Milli(1000))], true, at(10));
        assert_eq!(
            seconds(&showback, at(20)),
            [
                ("other".into(), "T4".into(), 10.0),
                ("team".into(), "A100".into(), 2.84),
            ]
        );
    }
}
