//! The extender's placer: its policy, with a request mix learnt online from the GPU
//! pods it filters (a cluster has no trace to read the mix from in advance).

use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::fragment::{GpuShape, RequestMix, TaskMix, TaskShape};
use super::policy::{Placer, Policy};
use super::request::GpuRequest;

pub struct LearningPlacer {
    base: Placer,
    /// GPU shapes with the models each pod accepts: FGD's mix (models left out) and
    /// the pinned demand (`choice`).
    mix: RequestMix,
    current: ArcSwap<Placer>,
    refreshing: Mutex<()>,
    /// The learnt mix, for every policy (the fragmentation gauge reads it).
    learned: ArcSwap<TaskMix>,
}

impl LearningPlacer {
    pub(crate) fn new(policy: Policy, gpu_manager_compat: bool) -> Self {
        let base = Placer::new(policy).with_gpu_manager_compat(gpu_manager_compat);
        LearningPlacer {
            current: ArcSwap::from_pointee(base.clone()),
            refreshing: Mutex::new(()),
            base,
            mix: RequestMix::new(),
            learned: ArcSwap::from_pointee(TaskMix::default()),
        }
    }

    /// The placer to use now.
    pub(crate) fn placer(&self) -> Arc<Placer> {
        self.current.load_full()
    }

    /// Count the request of a pod that was placed, with the models it accepts (none:
    /// any), into the mix and the pinned demand (`choice`). Only placements count: a
    /// caller that merely asks cannot shape either. Cheap: a short lock, and now and
    /// then a new snapshot.
    pub(crate) fn observe(&self, request: &GpuRequest, models: &[String]) {
        let Some(gpu) = GpuShape::of_request(request) else {
            return;
        };
        let shape = TaskShape::gpu_only(gpu).with_models(models);
        if self.mix.observe_shape(shape) {
            // One refresh at a time, so that the last stored is the latest taken.
            let _refreshing = self.refreshing.lock();
            let mix = Arc::new(self.mix.snapshot_any_model());
            self.learned.store(mix.clone());
            let mut placer = (self.base.clone()).with_pinned(Arc::new(self.mix.pinned()));
            if self.base.policy == Policy::Fgd {
                placer = placer.with_mix(mix);
            }
            self.current.store(Arc::new(placer));
        }
    }

    /// The request mix learnt so far, whatever the policy.
    pub fn learned_mix(&self) -> Arc<TaskMix> {
        self.learned.load_full()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::placement::GpuDemand;

    #[test]
    fn fgd_learns_the_mix_from_what_it_places() {
        let placer = LearningPlacer::new(Policy::Fgd, true);
        let share = GpuRequest::one(GpuDemand::Share {
            core: 50,
            memory: 2,
        });
        assert!(placer.placer().mix.is_empty());
        placer.observe(&share, &[]);
        assert!(placer.placer().mix.len() == 1);
        let other = LearningPlacer::new(Policy::Binpack, true);
        other.observe(&share, &[]);
        assert!(other.placer().mix.is_empty(), "only fgd reads the mix");
        assert_eq!(
            other.learned_mix().len(),
            1,
            "but every policy learns it, for the gauge"
        );
    }

    /// Every policy learns the demand pinned to models, which model choice reads.
    #[test]
    fn every_policy_learns_what_is_pinned_to_models() {
        let whole = GpuRequest::one(GpuDemand::Whole { gpus: 1 });
        for policy in [Policy::Fgd, Policy::Binpack] {
            let placer = LearningPlacer::new(policy, true);
            placer.observe(&whole, &[]);
            placer.observe(&GpuRequest::default(), &["T4".to_string()]);
            assert!(
                placer.placer().pinned.is_empty(),
                "a pod without GPUs is not counted"
            );
            placer.observe(&whole, &["T4".to_string()]);
            assert!(!placer.placer().pinned.is_empty(), "{policy}");
            placer.observe(&whole, &["A100".to_string()]);
            assert_eq!(
                placer.learned_mix().len(),
                1,
                "FGD's mix is GPU shapes alone: one shape, whatever the models"
            );
        }
    }

    /// A pod pinned to a model set never seen before counts at once, between the
    /// refreshes of the mix's slow drift: the first pods pinned to a scarce model are
    /// the ones model choice must protect it for.
    #[test]
    fn a_new_pinned_set_counts_at_once() {
        let whole = GpuRequest::one(GpuDemand::Whole { gpus: 1 });
        let placer = LearningPlacer::new(Policy::Original, true);
        for _ in 0..5 {
            placer.observe(&whole, &[]);
        }
        placer.observe(&whole, &["T4".to_string()]);
        assert!(
            !placer.placer().pinned.is_empty(),
            "the sixth pod, the first pinned to T4, is in the pinned demand"
        );
    }
}
