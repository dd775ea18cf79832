"""Pretrained feature extraction: text encoders (MiniLM, BERT) and an image encoder (ResNet-18).

`extract.extract_features` turns a prepared dataset (array format) into an embedding dataset in the
same array format (features float32 [n, dim], labels/clients/official_test copied), with the
encoder's provenance in its metadata.
"""
