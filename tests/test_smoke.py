"""The package imports and its example clusters load."""

import tangram_opt
from tangram_opt.specs import example_clusters, load_cluster


def test_examples_load():
    names = example_clusters()
    assert len(names) >= 4
    for n in names:
        c = load_cluster(n)
        assert c.num_gpus > 0
        assert tangram_opt.Cluster is type(c)
