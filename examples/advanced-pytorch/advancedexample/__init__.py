"""advancedexample: Flower's advanced-pytorch app made asynchronous with asyncfl."""
