"""scikit-learn's GridSearchCV on scaler-executor, through the joblib backend.

    python examples/gridsearch_joblib.py

``import scaler_executor.joblib`` registers the joblib backend ``"scaler"``; inside
``parallel_config("scaler")`` every ``n_jobs=-1`` in scikit-learn runs on a local cluster
that starts on first use (one per process, reused by every ``Parallel`` call scikit-learn
makes).  To use a running cluster instead: ``parallel_config("scaler",
address="tcp://scheduler-host:8786")``.
"""

from __future__ import annotations

import time

from joblib import parallel_config
from sklearn.datasets import load_digits
from sklearn.model_selection import GridSearchCV
from sklearn.svm import SVC

import scaler_executor.joblib


def main() -> None:
    X, y = load_digits(return_X_y=True)
    grid = {"C": [0.1, 1, 10], "gamma": [1e-4, 1e-3, 1e-2]}
    search = GridSearchCV(SVC(), grid, cv=3, n_jobs=-1)
    start = time.perf_counter()
    with parallel_config("scaler"):
        search.fit(X, y)
    elapsed = time.perf_counter() - start
    fits = len(search.cv_results_["params"]) * search.n_splits_
    print(f"{fits} fits on scaler-executor in {elapsed:.1f} s")
    print(f"best params: {search.best_params_}")
    print(f"best score: {search.best_score_:.3f}")
    scaler_executor.joblib.shutdown()


if __name__ == "__main__":
    main()
