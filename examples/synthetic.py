"""A synthetic AnnData file for the examples: CSR counts in which each class
over-expresses its own block of genes (so a model can learn something), and a
categorical "cell_type" column."""


def write_h5ad(path, rows, genes, classes=5, seed=0):
    import anndata as ad
    import numpy as np
    import pandas as pd
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=rows)
    counts = sp.random(rows, genes, density=0.05, format="csr", dtype=np.float32, random_state=seed)
    signal = sp.csr_matrix(
        (np.full(rows, 5.0, np.float32), (np.arange(rows), labels * (genes // classes))), shape=(rows, genes)
    )
    obs = pd.DataFrame(
        {"cell_type": pd.Categorical([f"type{c}" for c in labels])}, index=[f"cell{i}" for i in range(rows)]
    )
    ad.AnnData((counts + signal).tocsr(), obs=obs).write_h5ad(path)
