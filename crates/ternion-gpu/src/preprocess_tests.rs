//! Tests of the shader preprocessor.

use super::preprocess;

#[test]
fn preprocessor_branches_and_nesting() {
    let src = "a\n#if X\nb\n#if Y\nc\n#else\nd\n#endif\n#else\ne\n#endif\nf\n";
    let lines = |s: String| {
        s.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(lines(preprocess("t", src, &[]).unwrap()), ["a", "e", "f"]);
    assert_eq!(
        lines(preprocess("t", src, &["X"]).unwrap()),
        ["a", "b", "d", "f"]
    );
    assert_eq!(
        lines(preprocess("t", src, &["X", "Y"]).unwrap()),
        ["a", "b", "c", "f"]
    );
    assert_eq!(
        lines(preprocess("t", src, &["Y"]).unwrap()),
        ["a", "e", "f"]
    );
    assert!(preprocess("t", "#if X\n", &[]).is_err());
    assert!(preprocess("t", "#endif\n", &[]).is_err());
    let e = preprocess("t", "a\n#define X\n", &[]).unwrap_err();
    assert!(
        matches!(&e, crate::Error::Shader { kernel, message }
            if kernel == "t:2" && message.contains("unknown directive '#define X'")),
        "{e}"
    );
}
