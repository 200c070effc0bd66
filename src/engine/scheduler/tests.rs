use super::held_back;

#[test]
fn holds_back_possible_stop_prefixes() {
    let stops = vec!["###".to_string(), "\nUser:".to_string()];
    assert_eq!(held_back("hello", &stops), 0);
    assert_eq!(held_back("hello#", &stops), 1);
    assert_eq!(held_back("hello##", &stops), 2);
    assert_eq!(held_back("hi\nUs", &stops), 3);
    assert_eq!(
        held_back("é", &["éa".to_string()]),
        2,
        "whole characters only"
    );
}
