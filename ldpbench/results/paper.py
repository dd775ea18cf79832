"""Published numbers our campaigns are compared with (transcribed from ../shared/papers/)."""

# FedSel Table 3: gains and losses on accuracy (%) for private selection at ε = 2.
# gain = acc(X-PM-C) − acc(PM), loss = acc(X-PM-C) − acc(X-PM), X ∈ {EXP, PE, PS}.
# Keys use ldpbench's dataset and model names.
FEDSEL_TABLE3 = {
    ("syn-L-0.01-0.9", "lr"): {"exp": (8.6074, 0.3517), "pe": (5.410, 1.192), "ps": (5.975, 0.4970)},
    ("syn-L-0.01-0.9", "svm"): {"exp": (7.1950, 2.1593), "pe": (3.7704, 0.8533), "ps": (5.065, 2.0816)},
    ("bank", "lr"): {"exp": (2.4197, -0.157), "pe": (3.2338, 0.0464), "ps": (2.5525, 0.1463)},
    ("bank", "svm"): {"exp": (4.3823, 0.4436), "pe": (3.4369, 0.2530), "ps": (4.0244, 0.0164)},
    ("kdd99", "lr"): {"exp": (2.0471, 0.5091), "pe": (2.5148, 0.2322), "ps": (2.0171, 0.3428)},
    ("kdd99", "svm"): {"exp": (1.85629, -0.1625), "pe": (2.2168, 0.2288), "ps": (1.8291, 0.4465)},
    ("adult", "lr"): {"exp": (5.5745, 0.2935), "pe": (5.6445, 1.3096), "ps": (6.0535, 0.8091)},
    ("adult", "svm"): {"exp": (5.5361, 0.1949), "pe": (5.6057, 0.9550), "ps": (5.1442, 0.3852)},
}
TABLE3_EPSILON = 2.0
