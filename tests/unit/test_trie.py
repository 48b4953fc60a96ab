from core.trie import TopicTrie, filter_matches


def levels(text):
    return tuple(text.split("."))


def build(*filters):
    trie = TopicTrie()
    for f in filters:
        trie.add(levels(f), f)
    return trie


def test_exact_and_one_level_wildcard():
    trie = build("a.b.c", "a.*.c", "a.*", "*.b.c", "x.y")
    assert sorted(trie.match(levels("a.b.c"))) == ["*.b.c", "a.*.c", "a.b.c"]
    assert trie.match(levels("a.b")) == ["a.*"]
    assert trie.match(levels("a.b.c.d")) == []


def test_rest_wildcard_matches_parent_and_descendants():
    trie = build("a.>", ">")
    assert sorted(trie.match(levels("a"))) == [">", "a.>"]
    assert sorted(trie.match(levels("a.b.c"))) == [">", "a.>"]
    assert trie.match(levels("b")) == [">"]


def test_dollar_topics_not_matched_by_leading_wildcards():
    trie = build(">", "*.broker", "$SYS.>", "$SYS.broker")
    assert sorted(trie.match(levels("$SYS.broker"))) == ["$SYS.>", "$SYS.broker"]
    assert sorted(trie.match(levels("x.broker"))) == ["*.broker", ">"]


def test_each_subscriber_once_even_if_several_filters_of_it_match():
    trie = TopicTrie()
    trie.add(levels("a.b"), "s")
    trie.add(levels("a.*"), "s")
    assert trie.match(levels("a.b")) == ["s"]
    assert len(trie) == 2


def test_remove_prunes_and_stops_matching():
    trie = build("a.b.c", "a.b")
    assert trie.remove(levels("a.b.c"), "a.b.c")
    assert trie.match(levels("a.b.c")) == []
    assert trie.match(levels("a.b")) == ["a.b"]
    assert not trie.remove(levels("a.b.c"), "a.b.c")
    assert trie.remove(levels("a.b"), "a.b")
    assert trie._root.children == {}
    assert len(trie) == 0


def test_filter_matches_agrees_with_trie():
    filters = ["a.b", "a.*", "a.>", ">", "*.*", "$SYS.>", "*", "a.*.c"]
    topics = ["a", "a.b", "a.b.c", "b.c", "$SYS.x", "$SYS", "a.x.c"]
    trie = build(*filters)
    for topic in topics:
        assert sorted(trie.match(levels(topic))) == sorted(f for f in filters if filter_matches(levels(f), levels(topic))), topic
