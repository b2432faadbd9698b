//! The task set fed made-up event sequences, one test per attribute and
//! per task management function.

use super::*;
use ethersan_scsi::ResetKind;

type Set = TaskSet<&'static str, u32>;

/// Insert and admit a task whose data is all here.
fn add(s: &mut Set, tag: Tag, lun: u64, attr: TaskAttr) {
    s.insert(tag, lun, attr, true, false, "t").unwrap();
    assert!(s.admit(tag));
}

fn startable(s: &mut Set) -> Vec<Tag> {
    std::iter::from_fn(|| s.next_startable()).collect()
}

#[test]
fn simple_tasks_all_start_at_once() {
    let mut s = Set::new();
    for t in 1..=4 {
        add(&mut s, t, 0, TaskAttr::Simple);
    }
    assert_eq!(startable(&mut s), vec![1, 2, 3, 4]);
    assert_eq!(s.running(), 4);
    assert!(startable(&mut s).is_empty());
}

#[test]
fn ordered_waits_for_older_and_blocks_newer() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Simple);
    add(&mut s, 2, 0, TaskAttr::Ordered);
    add(&mut s, 3, 0, TaskAttr::Simple);
    assert_eq!(startable(&mut s), vec![1]);
    s.complete(1).unwrap();
    assert_eq!(startable(&mut s), vec![2]);
    s.complete(2).unwrap();
    assert_eq!(startable(&mut s), vec![3]);
}

#[test]
fn two_ordered_tasks_run_one_after_the_other() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Ordered);
    add(&mut s, 2, 0, TaskAttr::Ordered);
    assert_eq!(startable(&mut s), vec![1]);
    s.complete(1).unwrap();
    assert_eq!(startable(&mut s), vec![2]);
}

#[test]
fn head_of_queue_starts_at_once_even_behind_ordered() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Simple);
    add(&mut s, 2, 0, TaskAttr::Ordered);
    add(&mut s, 3, 0, TaskAttr::HeadOfQueue);
    add(&mut s, 4, 0, TaskAttr::Simple);
    // 1 runs, 2 waits for 1, the HOQ task runs at once, 4 waits for both
    // the ORDERED and the HOQ task.
    assert_eq!(startable(&mut s), vec![3, 1]);
    s.complete(3).unwrap();
    assert!(startable(&mut s).is_empty());
    s.complete(1).unwrap();
    assert_eq!(startable(&mut s), vec![2]);
    s.complete(2).unwrap();
    assert_eq!(startable(&mut s), vec![4]);
}

#[test]
fn newest_head_of_queue_goes_first() {
    let mut s = Set::new();
    // Tasks held for data keep the queue from draining between admissions.
    s.insert(1, 0, TaskAttr::HeadOfQueue, false, false, "a")
        .unwrap();
    s.insert(2, 0, TaskAttr::HeadOfQueue, false, false, "b")
        .unwrap();
    s.admit(1);
    s.admit(2);
    s.set_data_ready(1);
    s.set_data_ready(2);
    assert_eq!(startable(&mut s), vec![2, 1]);
}

#[test]
fn a_task_runs_only_after_admission_and_data() {
    let mut s = Set::new();
    s.insert(7, 0, TaskAttr::Simple, false, false, "w").unwrap();
    assert!(startable(&mut s).is_empty());
    s.set_data_ready(7);
    assert!(startable(&mut s).is_empty(), "not admitted yet");
    assert!(s.admit(7));
    assert_eq!(startable(&mut s), vec![7]);
}

#[test]
fn a_task_collecting_data_still_holds_back_newer_simple_tasks_behind_it_only_if_ordered() {
    let mut s = Set::new();
    s.insert(1, 0, TaskAttr::Ordered, false, false, "w")
        .unwrap();
    s.admit(1);
    add(&mut s, 2, 0, TaskAttr::Simple);
    assert!(startable(&mut s).is_empty());
    s.set_data_ready(1);
    assert_eq!(startable(&mut s), vec![1]);
    s.complete(1).unwrap();
    assert_eq!(startable(&mut s), vec![2]);
}

#[test]
fn duplicate_tags_are_refused() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Simple);
    assert_eq!(
        s.insert(1, 0, TaskAttr::Simple, true, false, "again"),
        Err("again")
    );
    assert_eq!(s.len(), 1);
}

#[test]
fn completing_unknown_or_idle_tasks_is_refused() {
    let mut s = Set::new();
    assert!(s.complete(9).is_none());
    s.insert(1, 0, TaskAttr::Simple, false, false, "w").unwrap();
    assert!(s.complete(1).is_none(), "not running");
    assert!(!s.admit(2));
}

#[test]
fn abort_task_removes_a_waiting_task_at_once() {
    let mut s = Set::new();
    s.insert(5, 3, TaskAttr::Simple, false, false, "w").unwrap();
    s.admit(5);
    let o = s.task_management(Tmf::AbortTask { lun: 3, tag: 5 }, true, 100);
    assert_eq!(o.response, TmfResponse::Complete);
    assert_eq!(o.done, Some(100));
    assert_eq!(o.removed.len(), 1);
    assert!(o.removed[0].admitted);
    assert!(s.is_empty());
}

#[test]
fn abort_task_of_a_running_task_waits_for_it_and_suppresses_its_response() {
    let mut s = Set::new();
    add(&mut s, 5, 0, TaskAttr::Simple);
    assert_eq!(startable(&mut s), vec![5]);
    let o = s.task_management(Tmf::AbortTask { lun: 0, tag: 5 }, true, 100);
    assert_eq!(o.done, None);
    assert!(o.removed.is_empty());
    let c = s.complete(5).unwrap();
    assert!(c.aborted);
    assert_eq!(c.tmfs_done, vec![(100, TmfResponse::Complete)]);
}

#[test]
fn abort_task_names_the_lun_too() {
    let mut s = Set::new();
    add(&mut s, 5, 1, TaskAttr::Simple);
    let o = s.task_management(Tmf::AbortTask { lun: 0, tag: 5 }, true, 1);
    assert_eq!(o.response, TmfResponse::NoTask);
    let o = s.task_management(Tmf::AbortTask { lun: 1, tag: 6 }, true, 2);
    assert_eq!(o.response, TmfResponse::NoTask);
    assert_eq!(s.len(), 1);
}

#[test]
fn abort_task_set_touches_one_lun_of_this_nexus_only() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Simple);
    add(&mut s, 2, 1, TaskAttr::Simple);
    s.insert(3, 1, TaskAttr::Simple, false, false, "w").unwrap();
    startable(&mut s);
    let o = s.task_management(Tmf::AbortTaskSet { lun: 1 }, true, 9);
    assert_eq!(o.response, TmfResponse::Complete);
    assert_eq!(o.effects, TmfEffects::default());
    assert_eq!(o.removed.len(), 1);
    assert!(!o.removed[0].admitted);
    assert_eq!(o.done, None, "task 2 is running");
    assert!(!s.complete(1).unwrap().aborted);
    let c = s.complete(2).unwrap();
    assert!(c.aborted);
    assert_eq!(c.tmfs_done, vec![(9, TmfResponse::Complete)]);
}

#[test]
fn lun_scoped_functions_on_a_missing_lun_answer_no_lun() {
    for tmf in [
        Tmf::AbortTaskSet { lun: 4 },
        Tmf::ClearTaskSet { lun: 4 },
        Tmf::LogicalUnitReset { lun: 4 },
        Tmf::ClearAca { lun: 4 },
    ] {
        let mut s = Set::new();
        add(&mut s, 1, 4, TaskAttr::Simple);
        let o = s.task_management(tmf, false, 0);
        assert_eq!(o.response, TmfResponse::NoLun, "{tmf:?}");
        assert_eq!(o.effects, TmfEffects::default());
        assert_eq!(s.len(), 1, "nothing aborted by {tmf:?}");
    }
}

#[test]
fn clear_task_set_reaches_other_nexuses() {
    let mut s = Set::new();
    add(&mut s, 1, 2, TaskAttr::Simple);
    let o = s.task_management(Tmf::ClearTaskSet { lun: 2 }, true, 0);
    assert_eq!(o.effects.abort_others, Some(Some(2)));
    assert_eq!(o.effects.reset, None);
    assert_eq!(o.removed.len(), 1);
}

#[test]
fn logical_unit_reset_resets_the_lu_and_others() {
    let mut s = Set::new();
    add(&mut s, 1, 2, TaskAttr::Simple);
    add(&mut s, 2, 3, TaskAttr::Simple);
    let o = s.task_management(Tmf::LogicalUnitReset { lun: 2 }, true, 0);
    assert_eq!(o.response, TmfResponse::Complete);
    assert_eq!(o.effects.abort_others, Some(Some(2)));
    assert_eq!(o.effects.reset, Some((ResetKind::LogicalUnit, Some(2))));
    assert!(!o.effects.end_sessions);
    assert_eq!(o.removed.len(), 1);
    assert!(s.contains(2));
}

#[test]
fn clear_aca_is_not_supported() {
    let mut s = Set::new();
    let o = s.task_management(Tmf::ClearAca { lun: 0 }, true, 0);
    assert_eq!(o.response, TmfResponse::NotSupported);
}

#[test]
fn nexus_and_target_resets_abort_everything() {
    for (tmf, reset, end) in [
        (Tmf::ItNexusReset, None, false),
        (
            Tmf::TargetWarmReset,
            Some((ResetKind::TargetWarm, None)),
            false,
        ),
        (
            Tmf::TargetColdReset,
            Some((ResetKind::TargetCold, None)),
            true,
        ),
    ] {
        let mut s = Set::new();
        add(&mut s, 1, 0, TaskAttr::Simple);
        add(&mut s, 2, 5, TaskAttr::Ordered);
        assert_eq!(startable(&mut s), vec![1]);
        let o = s.task_management(tmf, true, 7);
        assert_eq!(o.response, TmfResponse::Complete);
        assert_eq!(o.effects.reset, reset, "{tmf:?}");
        assert_eq!(o.effects.end_sessions, end, "{tmf:?}");
        assert_eq!(
            o.effects.abort_others,
            if tmf == Tmf::ItNexusReset {
                None
            } else {
                Some(None)
            }
        );
        assert_eq!(o.removed.len(), 1, "the ORDERED task never started");
        assert_eq!(o.done, None);
        let c = s.complete(1).unwrap();
        assert!(c.aborted);
        assert_eq!(c.tmfs_done, vec![(7, TmfResponse::Complete)]);
        assert!(s.is_empty());
    }
}

#[test]
fn exempt_tasks_are_aborted_but_not_waited_for() {
    let mut s = Set::new();
    s.insert(1, 0, TaskAttr::Simple, true, true, "sanitize")
        .unwrap();
    s.admit(1);
    assert_eq!(startable(&mut s), vec![1]);
    let o = s.task_management(Tmf::LogicalUnitReset { lun: 0 }, true, 3);
    assert_eq!(o.done, Some(3), "SANITIZE is not waited for");
    let c = s.complete(1).unwrap();
    assert!(c.aborted);
    assert!(c.tmfs_done.is_empty());
}

#[test]
fn a_tmf_waits_for_every_aborted_running_task() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Simple);
    add(&mut s, 2, 0, TaskAttr::Simple);
    startable(&mut s);
    let o = s.task_management(Tmf::AbortTaskSet { lun: 0 }, true, 1);
    assert_eq!(o.done, None);
    assert!(s.complete(2).unwrap().tmfs_done.is_empty());
    assert_eq!(
        s.complete(1).unwrap().tmfs_done,
        vec![(1, TmfResponse::Complete)]
    );
}

#[test]
fn two_tmfs_waiting_on_the_same_task_both_finish() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Simple);
    startable(&mut s);
    assert_eq!(
        s.task_management(Tmf::AbortTask { lun: 0, tag: 1 }, true, 1)
            .done,
        None
    );
    // Already aborted, still running: the second waits for it too.
    let o = s.task_management(Tmf::AbortTaskSet { lun: 0 }, true, 2);
    assert_eq!(o.done, None);
    assert_eq!(
        s.complete(1).unwrap().tmfs_done,
        vec![(1, TmfResponse::Complete), (2, TmfResponse::Complete)]
    );
}

#[test]
fn an_aborted_ordered_task_releases_the_tasks_behind_it() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Simple);
    s.insert(2, 0, TaskAttr::Ordered, false, false, "w")
        .unwrap();
    s.admit(2);
    add(&mut s, 3, 1, TaskAttr::Simple);
    assert_eq!(startable(&mut s), vec![1]);
    let o = s.task_management(Tmf::AbortTask { lun: 0, tag: 2 }, true, 0);
    assert_eq!(o.removed.len(), 1);
    assert_eq!(startable(&mut s), vec![3]);
}

#[test]
fn abort_scope_all_from_a_shutdown() {
    let mut s = Set::new();
    add(&mut s, 1, 0, TaskAttr::Simple);
    s.insert(2, 0, TaskAttr::Simple, false, false, "w").unwrap();
    startable(&mut s);
    let (removed, wait) = s.abort(AbortScope::All);
    assert_eq!(removed.len(), 1);
    assert_eq!(wait, vec![1]);
    // Aborting again removes nothing more; the running task is still
    // waited for.
    let (removed, wait) = s.abort(AbortScope::All);
    assert!(removed.is_empty());
    assert_eq!(wait, vec![1]);
}
