"""Load a Mulan multi-label data set: a train/test ARFF pair and its ``.xml`` label header.

A Mulan directory ``DIR`` holds ``NAME.xml`` (one ``<label name="..."/>`` per
label column) and ``NAME-train.arff`` / ``NAME-test.arff``.  The label columns
are the attributes named in the header (wherever they sit in the ARFF); every
other attribute is a feature.

Following the sparsemax authors' converter, rows with no positive label are
dropped from *both* files (about half of birds' rows): the losses against
y/|y| are undefined for |y| = 0.  The counts dropped are kept on the result so
that reports can say so.
"""

from __future__ import annotations

import glob
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np

from .arff import read_arff


@dataclass
class MultilabelData:
    name: str
    X_train: np.ndarray  # (n_train, n_features) float64, raw (not standardised)
    Y_train: np.ndarray  # (n_train, n_labels) bool
    X_test: np.ndarray
    Y_test: np.ndarray
    labels: list
    features: list
    dropped_train: int  # rows with no label removed from the training file
    dropped_test: int


def read_label_names(xml_path) -> list:
    """Label names from a Mulan ``.xml`` header, in file order."""
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as exc:
        raise ValueError(f"{xml_path}: not a Mulan XML header ({exc})") from None
    names = [el.get("name") for el in root.iter() if el.tag.split("}")[-1] == "label"]
    if not names:
        raise ValueError(f"{xml_path}: no <label name=...> elements")
    return names


def find_pair(directory) -> tuple:
    """(name, xml, train arff, test arff) for a Mulan directory."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"data directory not found: {directory}")
    xmls = sorted(glob.glob(os.path.join(directory, "*.xml")))
    if len(xmls) != 1:
        raise ValueError(f"data directory must hold exactly one Mulan .xml header, found {len(xmls)} in {directory}")
    name = os.path.splitext(os.path.basename(xmls[0]))[0]
    train = os.path.join(directory, f"{name}-train.arff")
    test = os.path.join(directory, f"{name}-test.arff")
    missing = [p for p in (train, test) if not os.path.isfile(p)]
    if missing:
        raise ValueError(
            f"data directory {directory} has no train/test split ({', '.join(os.path.basename(p) for p in missing)} "
            f"missing); this protocol needs the official Mulan {name}-train.arff and {name}-test.arff"
        )
    return name, xmls[0], train, test


def _split(names, matrix, labels, path):
    index = {n: i for i, n in enumerate(names)}
    absent = [l for l in labels if l not in index]
    if absent:
        raise ValueError(f"{path}: label(s) named in the .xml header are not attributes: {absent[:5]}")
    lab = [index[l] for l in labels]
    feat = [i for i in range(len(names)) if i not in set(lab)]
    Y = matrix[:, lab]
    if not np.isin(Y, (0.0, 1.0)).all():
        raise ValueError(f"{path}: label columns must hold only 0 and 1")
    return matrix[:, feat], Y.astype(bool), [names[i] for i in feat]


def load_mulan(directory) -> MultilabelData:
    """Read a Mulan train/test pair, dropping rows without labels from both."""
    name, xml, train_path, test_path = find_pair(directory)
    labels = read_label_names(xml)
    Xtr, Ytr, feats = _split(*read_arff(train_path), labels, train_path)
    Xte, Yte, feats_te = _split(*read_arff(test_path), labels, test_path)
    if feats != feats_te:
        raise ValueError(f"{name}: train and test files have different feature attributes")
    keep_tr, keep_te = Ytr.any(1), Yte.any(1)
    return MultilabelData(
        name=name,
        X_train=Xtr[keep_tr], Y_train=Ytr[keep_tr], X_test=Xte[keep_te], Y_test=Yte[keep_te],
        labels=labels, features=feats,
        dropped_train=int((~keep_tr).sum()), dropped_test=int((~keep_te).sum()),
    )
