def build_map(site, observations, size, train_size, sinks):
    return None
