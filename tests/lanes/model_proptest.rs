//! Property test: random operation sequences applied to a `MemoryStream` and to the reference
//! model in `tests/model/mod.rs`, compared after every step (the same harness the `lane_ops` fuzz
//! target runs).

use crate::model;

use model::{HeldIx, ItemSpec, LaneIx, Op, Scenario, SmallPos};
use proptest::prelude::*;

fn item_spec() -> impl Strategy<Value = ItemSpec> {
    prop_oneof![
        3 => any::<u8>().prop_map(|k| ItemSpec::Ahead(k % 4)),
        2 => (0u8..16).prop_map(|p| ItemSpec::At(SmallPos(p))),
        1 => Just(ItemSpec::Snapshot),
        1 => Just(ItemSpec::SnapshotComplete),
        1 => Just(ItemSpec::Reserved),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let lane = (0u8..3).prop_map(LaneIx);
    let held = (0u8..8).prop_map(HeldIx);
    prop_oneof![
        6 => (lane.clone(), item_spec()).prop_map(|(l, s)| Op::TryPublish(l, s)),
        2 => (lane.clone(), item_spec()).prop_map(|(l, s)| Op::Publish(l, s)),
        6 => lane.clone().prop_map(Op::TryRecv),
        2 => lane.clone().prop_map(Op::Recv),
        1 => (lane.clone(), any::<u8>()).prop_map(|(l, k)| Op::TryRecvDetached(l, k)),
        5 => held.clone().prop_map(Op::Ack),
        2 => held.clone().prop_map(Op::Nack),
        2 => held.clone().prop_map(Op::Drop),
        1 => held.prop_map(Op::SplitAck),
        1 => lane.clone().prop_map(Op::Reattach),
        1 => lane.clone().prop_map(Op::Close),
        1 => lane.clone().prop_map(Op::DropProducer),
        1 => lane.prop_map(Op::ClaimProducer),
        1 => Just(Op::Check),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (0u8..3, 0u8..4, prop::collection::vec(op(), 0..200)).prop_map(|(lanes, capacity, ops)| Scenario {
        lanes,
        capacity,
        ops,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Every step of every sequence: same outcome, watermark, idleness and lane stats.
    #[test]
    fn the_engine_matches_the_model(s in scenario()) {
        model::run(&s);
    }
}

/// Regression: a stale handle (from a consumer detached by a re-attach) that is still alive does
/// not hold back the lane's acked position, the watermark or `is_idle` once the new consumer
/// acked the redelivered item (L5/W1/W5: only acks count). It used to, until the handle ended.
#[test]
fn stale_handle_does_not_hold_back_the_watermark() {
    let s = Scenario {
        lanes: 0,
        capacity: 1,
        ops: vec![
            Op::TryPublish(LaneIx(0), ItemSpec::At(SmallPos(5))),
            Op::TryRecv(LaneIx(0)), // held[0]: first delivery
            Op::Reattach(LaneIx(0)),
            Op::TryRecv(LaneIx(0)), // held[1]: redelivery to the new consumer
            Op::Ack(HeldIx(1)),     // acked: by L5 the lane's acked position is now 5
            Op::Check,
        ],
    };
    model::run(&s);
}

/// The same sequence, then the stale handle ends: its ack is refused and the slot is freed.
#[test]
fn stale_handle_ending_releases_the_watermark() {
    let s = Scenario {
        lanes: 0,
        capacity: 1,
        ops: vec![
            Op::TryPublish(LaneIx(0), ItemSpec::At(SmallPos(5))),
            Op::TryRecv(LaneIx(0)),
            Op::Reattach(LaneIx(0)),
            Op::TryRecv(LaneIx(0)),
            Op::Ack(HeldIx(1)),
            Op::Ack(HeldIx(0)), // the stale handle's ack is refused (L8) and ends it
            Op::Check,
        ],
    };
    model::run(&s);
}
