//! Cross-TP invariance: a TP=k group whose rank j holds the tree of its block of the eight TP=8
//! leaves reduces to the same bits as the TP=8 group itself, for k in {1, 2, 4, 8}.
use fixed_tree::{Element, SUPPORTED_WORLD_SIZES, cross_tp_leaves, reduce};
use half::{bf16, f16};
use proptest::prelude::*;

/// Element bit patterns: arbitrary ones, specials, and moderate values that round and cancel.
fn bits(dtype: &'static str) -> impl Strategy<Value = u32> {
    let wide = dtype == "f32";
    let (sign, inf, qnan, snan, max, min_sub, one) = match dtype {
        "f32" => (0x8000_0000u32, 0x7f80_0000, 0x7fc0_0000, 0x7f80_0001, 0x7f7f_ffff, 1, 0x3f80_0000),
        "f16" => (0x8000, 0x7c00, 0x7e00, 0x7c01, 0x7bff, 1, 0x3c00),
        _ => (0x8000, 0x7f80, 0x7fc0, 0x7f81, 0x7f7f, 1, 0x3f80),
    };
    let mask = if wide { u32::MAX } else { 0xffff };
    let specials = vec![
        0,
        sign,
        inf,
        inf | sign,
        qnan,
        snan,
        qnan | sign | 0x5,
        max,
        max | sign,
        min_sub,
        min_sub | sign,
        one,
        one | sign,
    ];
    prop_oneof![
        3 => any::<u32>().prop_map(move |b| b & mask),
        1 => proptest::sample::select(specials),
        // Moderate values with a few nearby exponents, random low bits and sign.
        3 => (any::<bool>(), 0u32..0x0100_0000).prop_map(move |(neg, low)| {
            let span = if wide { low } else { low >> 14 };
            (one - (one >> 4) + span) | if neg { sign } else { 0 }
        }),
    ]
}

fn same<T: Element>(a: T, b: T) -> bool {
    a.to_bits_u32() == b.to_bits_u32() || (a.is_nan() && b.is_nan())
}

fn check<T: Element>(leaf_bits: &[Vec<u32>]) -> Result<(), TestCaseError> {
    let leaves: Vec<Vec<T>> = leaf_bits.iter().map(|l| l.iter().map(|&b| T::from_bits_u32(b)).collect()).collect();
    let leaf_refs: Vec<&[T]> = leaves.iter().map(Vec::as_slice).collect();
    let n = leaves[0].len();
    let zero = T::from_bits_u32(0);
    let mut want = vec![zero; n];
    reduce(&leaf_refs, &mut want).unwrap();
    for k in SUPPORTED_WORLD_SIZES {
        let split = cross_tp_leaves(&leaf_refs, k).unwrap();
        prop_assert_eq!(split.len(), k);
        let split_refs: Vec<&[T]> = split.iter().map(Vec::as_slice).collect();
        let mut got = vec![zero; n];
        reduce(&split_refs, &mut got).unwrap();
        for i in 0..n {
            prop_assert!(
                same(got[i], want[i]),
                "{} k={} element {}: got {:#x}, want {:#x}",
                T::NAME,
                k,
                i,
                got[i].to_bits_u32(),
                want[i].to_bits_u32()
            );
        }
    }
    Ok(())
}

fn leaves(dtype: &'static str) -> impl Strategy<Value = Vec<Vec<u32>>> {
    (0usize..48).prop_flat_map(move |n| proptest::collection::vec(proptest::collection::vec(bits(dtype), n), 8))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn cross_tp_f32(l in leaves("f32")) {
        check::<f32>(&l)?;
    }

    #[test]
    fn cross_tp_f16(l in leaves("f16")) {
        check::<f16>(&l)?;
    }

    #[test]
    fn cross_tp_bf16(l in leaves("bf16")) {
        check::<bf16>(&l)?;
    }
}
